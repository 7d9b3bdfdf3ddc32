"""Score many token sequences with a last-token reward head: padding-free, prompts shared once.

A reward service receives sequences of very different lengths, and RL sends them in groups:
G responses to one prompt (GRPO). Padding every batch to its longest member wastes most of the
GPU on pad tokens, and scoring each response with its prompt recomputes that prompt G times.

`plan_packed` lays the sequences out as one packed token stream for `rk_varlen` attention
(models/attention.py):

- every sequence is its own attention span, positions restarting at 0, so no pad token is ever
  computed (the flash-attention varlen kernel takes the span boundaries);
- with `share_prefixes`, sequences that start with the same `min_prefix`+ tokens form a group:
  the common prefix is packed once, and each member contributes only its suffix, whose queries
  attend to the prefix's keys and then their own (positions continue after the prefix). Each
  sequence's keys are gathered from the stream by `rk_kv_index`; causality is aligned
  bottom-right, so a suffix token sees exactly what it would see in the unshared sequence.

The score is the head applied to the hidden state at each sequence's last token, as
`*ForSequenceClassification` and rewardkit's `RewardModel` read it. `padded_scores` is the
fallback where no varlen kernel runs (CPU, fp32): length-sorted buckets padded to a token
budget, so padding stays small without any special kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rewardkit.models.attention import KV_INDEX, explicit_boundaries


@dataclass(frozen=True)
class PackedPlan:
    """One packed forward: the token stream, its attention spans and where each score is read."""

    input_ids: torch.Tensor  # [1, T] every computed token once
    position_ids: torch.Tensor  # [1, T]
    cu_q: torch.Tensor  # int32 [spans + 1] query span boundaries in the stream
    cu_k: torch.Tensor  # int32 [spans + 1] key span boundaries in the gathered keys
    kv_index: torch.Tensor | None  # [K] stream position of each gathered key (None: keys = queries)
    max_q: int
    max_k: int
    score_at: torch.Tensor  # [N] stream position of each input sequence's last token
    input_tokens: int  # tokens of the sequences as given
    shared_groups: int  # prefix groups formed

    @property
    def computed_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def saved_tokens(self) -> int:
        """Prompt tokens not recomputed thanks to prefix sharing."""
        return self.input_tokens - self.computed_tokens

    def forward_kwargs(self, device: torch.device | str) -> dict[str, object]:
        kwargs: dict[str, object] = {
            "input_ids": self.input_ids.to(device, non_blocking=True),
            "position_ids": self.position_ids.to(device, non_blocking=True),
            "cu_seq_lens_q": self.cu_q.to(device, non_blocking=True),
            "cu_seq_lens_k": self.cu_k.to(device, non_blocking=True),
            "max_length_q": self.max_q,
            "max_length_k": self.max_k,
        }
        if self.kv_index is not None:
            kwargs[KV_INDEX] = self.kv_index.to(device, non_blocking=True)
        return kwargs


def _common_prefix(a: np.ndarray, b: np.ndarray, limit: int) -> int:
    differs = np.flatnonzero(a[:limit] != b[:limit])
    return int(differs[0]) if differs.size else limit


def _arrays(seqs: Sequence[Sequence[int]]) -> list[np.ndarray]:
    return [np.asarray(s, dtype=np.int64) for s in seqs]


def prefix_groups(seqs: Sequence[Sequence[int]], min_prefix: int) -> list[tuple[int, list[int]]]:
    """(shared prefix length, member indices) for each group of ≥ 2 sequences sharing ≥ min_prefix
    leading tokens. Each member keeps at least one token of its own (its score is read there)."""
    arrays = _arrays(seqs)
    buckets: dict[bytes, list[int]] = {}
    for i, seq in enumerate(arrays):
        if len(seq) > min_prefix:
            buckets.setdefault(seq[:min_prefix].tobytes(), []).append(i)
    groups = []
    for members in buckets.values():
        if len(members) < 2:
            continue
        first = arrays[members[0]]
        shared = min(len(arrays[m]) for m in members) - 1
        for m in members[1:]:
            shared = _common_prefix(first, arrays[m], shared)
        if shared >= min_prefix:
            groups.append((shared, members))
    return groups


def plan_packed(
    seqs: Sequence[Sequence[int]], *, share_prefixes: bool = False, min_prefix: int = 16
) -> PackedPlan:
    """Lay `seqs` out as one packed stream (see the module docstring).

    The layout is decided per sequence and built per token with numpy (a batch is tens of
    thousands of tokens, planned on the scoring thread between two forwards)."""
    if not seqs or any(len(s) == 0 for s in seqs):
        raise ValueError("plan_packed needs non-empty sequences")
    arrays = _arrays(seqs)
    groups = prefix_groups(arrays, min_prefix) if share_prefixes else []
    grouped = {m: (g, shared) for g, (shared, members) in enumerate(groups) for m in members}
    # one span per row: (sequence, first token, tokens, first position, prefix span or -1)
    pieces: list[np.ndarray] = []
    q_lens: list[int] = []
    first_pos: list[int] = []
    prefix_of: list[int] = []  # the span index of the prefix the span attends to, or -1
    score_span = [0] * len(arrays)
    prefix_span: dict[int, int] = {}
    for i, seq in enumerate(arrays):
        if i not in grouped:
            pieces.append(seq)
            q_lens.append(len(seq))
            first_pos.append(0)
            prefix_of.append(-1)
        else:
            g, shared = grouped[i]
            if g not in prefix_span:
                prefix_span[g] = len(q_lens)
                pieces.append(seq[:shared])
                q_lens.append(shared)
                first_pos.append(0)
                prefix_of.append(-1)
            pieces.append(seq[shared:])
            q_lens.append(len(seq) - shared)
            first_pos.append(shared)
            prefix_of.append(prefix_span[g])
        score_span[i] = len(q_lens) - 1
    lens = np.asarray(q_lens, dtype=np.int64)
    ends = np.cumsum(lens)
    begins = ends - lens
    total = int(ends[-1])
    # a token's position: its offset in its span plus the span's first position
    positions = np.arange(total, dtype=np.int64) - np.repeat(begins - np.asarray(first_pos), lens)
    key_lens = lens.copy()
    kv_index = None
    if groups:
        prefixes = np.asarray(prefix_of)
        has = prefixes >= 0
        key_lens[has] += lens[prefixes[has]]
        own = [np.arange(begins[k], ends[k]) for k in range(len(q_lens))]
        # each span's keys: its prefix span's stream positions (if it has one), then its own
        keys = [(own[p], own[k]) if p >= 0 else (own[k],) for k, p in enumerate(prefix_of)]
        kv_index = np.concatenate([part for parts in keys for part in parts])
    zero = np.zeros(1, dtype=np.int64)
    return PackedPlan(
        input_ids=torch.from_numpy(np.concatenate(pieces))[None],
        position_ids=torch.from_numpy(positions)[None],
        cu_q=torch.from_numpy(np.concatenate([zero, ends]).astype(np.int32)),
        cu_k=torch.from_numpy(np.concatenate([zero, np.cumsum(key_lens)]).astype(np.int32)),
        kv_index=None if kv_index is None else torch.from_numpy(kv_index),
        max_q=int(lens.max()),
        max_k=int(key_lens.max()),
        score_at=torch.from_numpy(ends[score_span] - 1),
        input_tokens=sum(len(s) for s in arrays),
        shared_groups=len(groups),
    )


def packed_scores(
    backbone: torch.nn.Module, head: Callable[[torch.Tensor], torch.Tensor], plan: PackedPlan
) -> torch.Tensor:
    """One forward of the packed stream through `backbone` (attn_implementation `rk_varlen`), the
    head at each sequence's last token: [N] scores in the head's dtype."""
    device = next(backbone.parameters()).device
    kwargs = plan.forward_kwargs(device)
    with explicit_boundaries():
        hidden = backbone(**kwargs, use_cache=False).last_hidden_state
    last = hidden[0].index_select(0, plan.score_at.to(device))
    weight = getattr(head, "weight", None)
    if weight is not None:
        last = last.to(weight.dtype)
    return head(last).reshape(-1)


def length_buckets(lengths: Sequence[int], max_batch_tokens: int) -> list[list[int]]:
    """Indices sorted by length and cut so that rows × longest row ≤ max_batch_tokens (a sequence
    longer than the budget gets a bucket of its own)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    buckets: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (len(current) + 1) * lengths[i] > max_batch_tokens:
            buckets.append(current)
            current = []
        current.append(i)
    if current:
        buckets.append(current)
    return buckets


def padded_scores(
    forward: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    seqs: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    max_batch_tokens: int,
    device: torch.device | str,
) -> tuple[torch.Tensor, int]:
    """(scores, token slots computed) through `forward(input_ids, attention_mask, lengths)` on
    right-padded length buckets; the slots minus the real tokens are the padding."""
    out = torch.empty(len(seqs), dtype=torch.float32)
    slots = 0
    for bucket in length_buckets([len(s) for s in seqs], max_batch_tokens):
        width = max(len(seqs[i]) for i in bucket)
        slots += width * len(bucket)
        input_ids = torch.full((len(bucket), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(bucket), width), dtype=torch.long)
        for row, i in enumerate(bucket):
            input_ids[row, : len(seqs[i])] = torch.as_tensor(seqs[i])
            mask[row, : len(seqs[i])] = 1
        lengths = mask.sum(1)
        scores = forward(input_ids.to(device), mask.to(device), lengths.to(device))
        out[torch.tensor(bucket)] = scores.float().cpu()
    return out, slots
