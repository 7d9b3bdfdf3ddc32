"""Names that rewardkit (this project before its rename to rewardplane) wrote into artifacts.

Checkpoints, exports, probes, data manifests and evaluation summaries written by rewardkit
are read exactly as before; nothing new is written under these names. Each reader takes its
current name and the matching legacy name from here, so this file is the whole list of what
the rename keeps readable (tests/fixtures/legacy_rewardkit holds one artifact of each layout).
"""

from __future__ import annotations

from pathlib import Path

CHECKPOINT_METADATA = "rewardkit.json"
EXPORT_RECORD = "rewardkit_export.json"
MASKED_MODEL_TYPE_KEY = "rewardkit_model_type"
MASKED_MODEL_TYPE_PREFIX = "rewardkit-"
PROBE_FORMAT = "rewardkit.probe/v1"
EVAL_SUMMARY_SCHEMA = "rewardkit.eval.summary/1"
BENCHMARK_SUMMARY_SCHEMA = "rewardkit.eval.benchmark/1"


def first_existing(directory: str | Path, *names: str) -> Path | None:
    """The first of `names` that is a file in `directory` (current name first), or None."""
    for name in names:
        path = Path(directory) / name
        if path.is_file():
            return path
    return None
