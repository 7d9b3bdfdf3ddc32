"""Which objective scores a saved checkpoint: the checkpoint's recorded `objective` → its module.

Every objective module exposes `load_scorer(path, *, device, reference_path, dtype,
max_batch_tokens) -> PairScorer`, the evaluation half of the objective protocol
(`rewardplane.objectives.base`). `rewardplane eval`
dispatches here and nowhere else, so adding an objective means adding one entry.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rewardplane.models.loading import OBJECTIVE, CheckpointError, is_checkpoint, read_metadata
from rewardplane.objectives import dpo, reward_model
from rewardplane.objectives.base import PairScorer

ScorerLoader = Callable[..., PairScorer]

SCORERS: dict[str, ScorerLoader] = {
    reward_model.OBJECTIVE: reward_model.load_scorer,
    dpo.OBJECTIVE: dpo.load_scorer,
}


def checkpoint_objective(path: str | Path) -> str:
    """The `objective` a rewardplane checkpoint records; a directory without `rewardplane.json`
    (an HF `*ForSequenceClassification` model) is a reward model."""
    if not is_checkpoint(path):
        return OBJECTIVE
    # read_metadata: a corrupt rewardplane.json is a coded CheckpointError (one line), not a traceback
    return read_metadata(path).get("objective")


def load_pair_scorer(
    path: str | Path,
    *,
    device: str,
    reference_path: str | Path | None = None,
    dtype: str = "fp32",
    max_batch_tokens: int = reward_model.DEFAULT_MAX_BATCH_TOKENS,
) -> PairScorer:
    """The scorer of whatever objective trained `path` (pairs → chosen, rejected, losses)."""
    objective = checkpoint_objective(path)
    loader = SCORERS.get(objective)
    if loader is None:
        raise CheckpointError(
            f"{path}: objective {objective!r} has no scorer; known: {', '.join(sorted(SCORERS))}",
            code="wrong_objective",
        )
    return loader(
        path, device=device, reference_path=reference_path, dtype=dtype, max_batch_tokens=max_batch_tokens
    )
