"""Deterministic, token-balanced assignment of pairs to optimizer steps, ranks and micro-batches.

A pair is atomic: both branches always land in the same micro-batch on the same rank, because
the Bradley–Terry / DPO loss needs them together. The order of pairs depends only on
(seed, epoch), and one optimizer step always consumes the same `global_batch_pairs` pairs
whatever the world size or accumulation, which is what makes DP=1 and DP=2 (or accumulation 1
and 4) produce the same gradient. Inside a step, pairs are spread over the
world_size × grad_accum micro-batches by longest-processing-time-first on token counts, so no
rank waits long for a straggler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from rewardplane.core.errors import ConfigError


@dataclass
class SamplerState:
    epoch: int = 0
    step_in_epoch: int = 0


class PairSampler:
    def __init__(
        self,
        num_tokens: Sequence[int],
        *,
        global_batch_pairs: int,
        world_size: int = 1,
        grad_accum: int = 1,
        seed: int = 0,
    ) -> None:
        buckets = world_size * grad_accum
        if global_batch_pairs < buckets:
            raise ConfigError(
                f"global_batch_pairs={global_batch_pairs} must be >= world_size*grad_accum={buckets}"
                " (every micro-batch needs at least one pair)"
            )
        if len(num_tokens) < global_batch_pairs:
            raise ConfigError(f"{len(num_tokens)} training pairs < global_batch_pairs={global_batch_pairs}")
        self.num_tokens = list(num_tokens)
        self.global_batch_pairs = global_batch_pairs
        self.world_size = world_size
        self.grad_accum = grad_accum
        self.seed = seed
        self.state = SamplerState()

    @property
    def steps_per_epoch(self) -> int:
        # The last incomplete step is dropped so every step has exactly global_batch_pairs pairs.
        return len(self.num_tokens) // self.global_batch_pairs

    def _order(self, epoch: int) -> list[int]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.num_tokens), generator=gen).tolist()

    def step_indices(self, epoch: int, step_in_epoch: int) -> list[int]:
        g = self.global_batch_pairs
        return self._order(epoch)[step_in_epoch * g : (step_in_epoch + 1) * g]

    def split(self, indices: Sequence[int]) -> list[list[list[int]]]:
        """[rank][micro_batch] -> pair indices, balanced by tokens (LPT greedy)."""
        buckets = self.world_size * self.grad_accum
        loads = [0] * buckets
        members: list[list[int]] = [[] for _ in range(buckets)]
        for i in sorted(indices, key=lambda i: (-self.num_tokens[i], i)):
            b = min(range(buckets), key=lambda b: (loads[b], b))
            members[b].append(i)
            loads[b] += self.num_tokens[i]
        plan = [sorted(m) for m in members]
        a = self.grad_accum
        return [plan[r * a : (r + 1) * a] for r in range(self.world_size)]

    def next_step(self) -> list[list[list[int]]]:
        """The plan for the next optimizer step; advances the position (epochs roll over)."""
        plan = self.split(self.step_indices(self.state.epoch, self.state.step_in_epoch))
        self.state.step_in_epoch += 1
        if self.state.step_in_epoch >= self.steps_per_epoch:
            self.state = SamplerState(epoch=self.state.epoch + 1, step_in_epoch=0)
        return plan

    def state_dict(self) -> dict[str, int]:
        return asdict(self.state)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.state = SamplerState(**state)
