"""The `Objective` protocol: what training and evaluation need from a reward model or DPO objective.

The loop owns everything objective-independent (sampling, loss scaling across ranks and
accumulation, optimisation, metrics, checkpoints, evaluation); an objective owns its model,
its per-pair loss and what its checkpoints claim to be. Keeping the loss a *sum over pairs*
here is what lets the loop normalise by the global pair count exactly once.

Evaluation has one path from pairs to scores, `score_in_batches`: the training loop's probe
evaluation (`Objective.score`) and `rewardplane eval` of a saved checkpoint (each objective
module's `load_scorer`, found through `rewardplane.objectives.registry`) both run it, each with
its objective's `BatchScore`, so the two give the same numbers for the same weights.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import torch
from torch import nn

from rewardplane.core.progress import Progress
from rewardplane.data.collate import Batch, Layout, collate
from rewardplane.data.config import DataConfig
from rewardplane.data.records import TokenizedPair
from rewardplane.models.config import ModelConfig

PairScores = tuple[np.ndarray, np.ndarray, np.ndarray | None]
"""float64 (chosen, rejected, per-pair loss or None for Bradley–Terry on the margin), input order."""

BatchScore = Callable[
    [nn.Module, Batch, Sequence[TokenizedPair]], tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]
]
"""One collated batch → (chosen, rejected, per-pair loss or None): what an objective scores."""


S = TypeVar("S")


@dataclass(frozen=True)
class RunShape:
    """What an objective reads of the `run:` section: the batch layout, where the run writes (a
    reference cache), and the batch it trains on. The rest of `run:` is the loop's alone."""

    layout: Layout
    run_dir: str
    global_batch_pairs: int
    grad_accum: int


@dataclass(frozen=True)
class Sections(Generic[S]):
    """The typed config sections an objective is built from: the shared `model:` and `data:`,
    the run's shape, and `settings`, its own section (the model `objectives.registry` names)."""

    model: ModelConfig
    data: DataConfig
    run: RunShape
    settings: S


@dataclass(frozen=True)
class TrainPairs:
    """The tokenised pairs a run trains and evaluates on, with the digests that name them (DPO
    keys its precomputed reference log-probs on them; a reward model needs none of it)."""

    train: Sequence[TokenizedPair] = ()
    train_sha256: str = ""
    eval: Sequence[TokenizedPair] = ()
    eval_sha256: str | None = None


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

    def score(self, model: nn.Module, pairs: Sequence[TokenizedPair], batch_size: int) -> PairScores:
        """The probe evaluation during training: `score_in_batches` with this objective's batch score."""

    def write_model(self, directory: Path, state_dict: dict[str, torch.Tensor], tokenizer: Any) -> str:
        """Write the model files of a checkpoint; return the weights' SHA-256."""

    def load_model_state(self, model: nn.Module, directory: Path) -> None:
        """Restore the trained weights from a checkpoint (before its optimizer state is loaded)."""

    def checkpoint_metadata(self) -> dict[str, Any]:
        """objective, role, head_type, base-model identity ... for `rewardplane.json`."""

    def validate_resume(self, metadata: dict[str, Any]) -> None:
        """Raise `CheckpointError` if a checkpoint was written by a different objective or head."""


def tokenisation_record(tokenizer: Any, model_config: Any, max_length: int) -> dict[str, Any]:
    """What every objective's checkpoint records of how it reads text: the tokenizer and chat
    template hashes, the attention implementation and `data.max_length`."""
    from rewardplane.data.tokenize import template_sha256, tokenizer_sha256

    return {
        "tokenizer_sha256": tokenizer_sha256(tokenizer),
        "template_sha256": template_sha256(tokenizer),
        "attn_implementation": model_config._attn_implementation,
        "max_length": max_length,
    }


def check_objective(metadata: dict[str, Any], name: str, role: str, run_kind: str) -> None:
    """Refuse to resume from a checkpoint another objective wrote."""
    from rewardplane.models.loading import CheckpointError

    if metadata.get("objective") != name or metadata.get("role") != role:
        raise CheckpointError(
            f"checkpoint objective {metadata.get('objective')!r} / role {metadata.get('role')!r};"
            f" a {run_kind} run resumes only from {name!r} / {role!r}",
            code="wrong_objective",
        )


@dataclass
class PairScorer:
    """A loaded checkpoint behind one call: pairs → scores (what `rewardplane eval` measures).

    `score_branches`, where the objective scores a branch on its own (reward models), takes the
    distinct texts of a benchmark directly, so no text is scored twice or paired with a stranger.
    `scoring` says how it scores (path, device, dtype, token budget) and, after each call, the
    token accounting of that call; both end up in the evaluation's throughput record.
    """

    objective: str
    tokenizer: Any
    metadata: dict[str, Any]
    score: Callable[..., PairScores]
    """`score(pairs, batch_size, progress=None)`: the objective's pair scores (`rewardplane eval`'s
    progress advanced per batch)."""
    score_branches: Callable[..., np.ndarray] | None = None
    """`score_branches(branches, progress=None)`: one score per branch through the packed path."""
    scoring: dict[str, Any] = field(default_factory=dict)
    score_branch_chunks: Callable[..., np.ndarray] | None = None
    """`score_branch_chunks(chunks, progress=None)`: `score_branches` of branches that arrive in
    chunks (from a tokenising thread), scores in arrival order, each chunk's forwards queued as
    it comes."""


@torch.no_grad()
def score_in_batches(
    model: nn.Module,
    pairs: Sequence[TokenizedPair],
    batch_size: int,
    score_batch: BatchScore,
    *,
    layout: Layout = "right",
    pad_token_id: int = 0,
    progress: Progress | None = None,
) -> PairScores:
    """The one pairs → scores path: eval mode, no grad, `batch_size` pairs per collated batch.

    `progress` is advanced by the pairs of each scored batch (`rewardplane eval`'s bar or lines).

    Every objective's evaluation, in training and from a checkpoint, runs through here, so
    scores cannot depend on which of the two asked. Models that only accept one layout (HF
    `*ForSequenceClassification` wrappers) declare `supported_layouts`; the first supported one
    is used instead of an unsupported request. The model's train/eval mode is restored.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    supported = getattr(model, "supported_layouts", None)
    if supported is not None and layout not in supported:
        layout = supported[0]
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    chosen: list[np.ndarray] = []
    rejected: list[np.ndarray] = []
    losses: list[np.ndarray] = []
    try:
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start : start + batch_size]
            batch = collate(chunk, layout=layout, pad_token_id=pad_token_id).to(device)
            c, r, loss = score_batch(model, batch, chunk)
            chosen.append(_float64(c))
            rejected.append(_float64(r))
            if loss is not None:
                losses.append(_float64(loss))
            if progress is not None:
                progress.update(len(chunk))
    finally:
        model.train(was_training)
    if not chosen:
        return np.zeros(0), np.zeros(0), None
    return np.concatenate(chosen), np.concatenate(rejected), np.concatenate(losses) if losses else None


def _float64(values: torch.Tensor) -> np.ndarray:
    """fp32 on the host first, as scores have always been read, then widened for the statistics."""
    return values.float().cpu().numpy().astype(np.float64)
