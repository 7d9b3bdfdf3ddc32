"""The `Objective` protocol: what the single training loop needs from a reward model or DPO recipe.

The loop owns everything objective-independent (sampling, loss scaling across ranks and
accumulation, optimisation, metrics, checkpoints, evaluation); an objective owns its model,
its per-pair loss and what its checkpoints claim to be. Keeping the loss a *sum over pairs*
here is what lets the loop normalise by the global pair count exactly once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from rewardkit.data.records import TokenizedPair


@dataclass
class MicroBatchOutput:
    """One micro-batch's result. `chosen`/`rejected` are detached per-pair scores (or implicit
    rewards) from which the loop computes accuracy, tie rate and score statistics."""

    loss_sum: torch.Tensor  # scalar, Σ per-pair loss, attached to the graph
    chosen: torch.Tensor
    rejected: torch.Tensor
    num_tokens: int
    num_slots: int
    # Objective-specific detached per-pair values (e.g. DPO's `logps/chosen`); the loop logs
    # each as its mean over the step's pairs, across accumulation and ranks.
    extra: dict[str, torch.Tensor] = field(default_factory=dict)


class Objective(Protocol):
    name: str  # `objective` in checkpoint metadata, e.g. "reward_model", "dpo"
    role: str  # `role` in checkpoint metadata, e.g. "reward_model", "policy"

    def build_model(self, tokenizer: Any) -> nn.Module:
        """A freshly initialised (or `init_from`-loaded) fp32 model on CPU."""

    def prepare(self, device: torch.device) -> None:
        """Ready what training needs besides the model, while the model is still on the CPU
        (DPO: move the frozen reference to `device`, or score every pair with it once and
        free it, so that pass never shares the device with the policy's training state)."""

    def micro_batch(
        self, model: nn.Module, pairs: Sequence[TokenizedPair], device: torch.device
    ) -> MicroBatchOutput:
        """Forward one micro-batch; return the per-pair loss *sum* (not mean)."""

    def score(
        self, model: nn.Module, pairs: Sequence[TokenizedPair], batch_size: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(chosen, rejected, per-pair losses or None for Bradley–Terry on the margin) for evaluation."""

    def write_model(self, directory: Path, state_dict: dict[str, torch.Tensor], tokenizer: Any) -> str:
        """Write the model files of a checkpoint; return the weights' SHA-256."""

    def load_model_state(self, model: nn.Module, directory: Path) -> None:
        """Restore the trained weights from a checkpoint (before its optimizer state is loaded)."""

    def checkpoint_metadata(self) -> dict[str, Any]:
        """objective, role, head_type, base-model identity ... for `rewardkit.json`."""

    def validate_resume(self, metadata: dict[str, Any]) -> None:
        """Raise `CheckpointError` if a checkpoint was written by a different objective or head."""


def check_objective(metadata: dict[str, Any], name: str, role: str, run_kind: str) -> None:
    """Refuse to resume from a checkpoint another objective wrote."""
    from rewardkit.models.loading import CheckpointError

    if metadata.get("objective") != name or metadata.get("role") != role:
        raise CheckpointError(
            f"checkpoint objective {metadata.get('objective')!r} / role {metadata.get('role')!r};"
            f" a {run_kind} run resumes only from {name!r} / {role!r}",
            code="wrong_objective",
        )


@dataclass
class PairScorer:
    """A loaded model behind one call: pairs → (chosen, rejected, per-pair loss or None)."""

    objective: str
    tokenizer: Any
    metadata: dict[str, Any]
    score: Callable[[list[TokenizedPair], int], tuple[np.ndarray, np.ndarray, np.ndarray | None]]
