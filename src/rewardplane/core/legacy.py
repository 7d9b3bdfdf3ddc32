"""Names that rewardkit (this project before its rename to rewardplane) wrote into artifacts.

Checkpoints, exports, probes, data manifests and evaluation summaries written by rewardkit
are read exactly as before; nothing new is written under these names. The same holds for a
checkpoint key renamed since (`data_manifest_sha256` → `train_pairs_sha256`). Each reader takes its
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
TRAIN_PAIRS_SHA256_KEY = "data_manifest_sha256"
"""The checkpoint key of `train_pairs_sha256` before issue 46: the same digest of the training
pairs (never a manifest's hash, whatever the name said); read where the new key is absent."""


def train_pairs_sha256(metadata: dict) -> str | None:
    """A checkpoint's training-pairs digest, under its current key or the one it was written with."""
    value = metadata.get("train_pairs_sha256")
    return metadata.get(TRAIN_PAIRS_SHA256_KEY) if value is None else value


def first_existing(directory: str | Path, *names: str) -> Path | None:
    """The first of `names` that is a file in `directory` (current name first), or None."""
    for name in names:
        path = Path(directory) / name
        if path.is_file():
            return path
    return None
