"""What `rewardplane eval --probe` and `rewardplane eval --benchmark` share: how the checkpoint is
loaded and scores, and how the numbers are bootstrapped. Light to import (no torch), so the
benchmark rules and the report can name it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rewardplane.core.progress import DEFAULT_EVERY_S
from rewardplane.eval.bootstrap import DEFAULT_REPLICATES, DEFAULT_SEED


@dataclass(frozen=True)
class EvalSettings:
    """The checkpoint's device, precision and batching (`reference_path`: a DPO policy's
    reference), the bootstrap's seed and replicates, and the progress line."""

    batch_size: int = 16
    device: str | None = None
    reference_path: str | Path | None = None
    dtype: str = "fp32"
    max_batch_tokens: int | None = None
    seed: int = DEFAULT_SEED
    replicates: int = DEFAULT_REPLICATES
    progress: bool = True
    progress_every_s: float = DEFAULT_EVERY_S

    def model_kwargs(self) -> dict[str, Any]:
        """`rewardplane.eval.runner.load_model`'s keywords besides the path and device."""
        return {
            "reference_path": self.reference_path,
            "dtype": self.dtype,
            "max_batch_tokens": self.max_batch_tokens,
        }

    def record(self, device: str) -> dict[str, Any]:
        """How the scores were computed, for the throughput record (with the scorer's own account)."""
        return {"device": device, "dtype": self.dtype, "batch_size": self.batch_size}
