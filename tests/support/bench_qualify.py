"""Plans for the qualify tests: two cheap scorers, a sweep that finishes in about a second, and
the command that starts tests/support/bench_fake_server.py in place of `rewardplane serve`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FAKE_SERVER = [sys.executable, str(ROOT / "tests" / "support" / "bench_fake_server.py"), "--deploy", "{deploy}",
               "--port", "{port}"]  # fmt: skip
SCORERS = [
    {"name": "a", "kind": "clip", "shape": "tiny-clip"},
    {"name": "b", "kind": "clip", "shape": "tiny-clip"},
]
FAST_SWEEP = {
    "batch": [2], "concurrency": [1, 2], "requests": 1, "warmup": 1, "window_s": 0.15,
    "stable_windows": 2, "max_windows": 3, "corpus_size": 10, "images": False,
}  # fmt: skip


def plan_doc(**kw: Any) -> dict[str, Any]:
    """A one-GPU fp16 plan of SCORERS with FAST_SWEEP; keyword arguments replace top-level keys."""
    doc = {"gpus": [0], "scorers": SCORERS, "dtypes": ["fp16"], "sweep": FAST_SWEEP}
    return {**doc, **kw}


def probe(gpus: int):
    """A device probe that claims `gpus` GPUs, for validating deploy files on a CPU box."""
    from rewardplane.deploy.config import DeviceProbe

    return DeviceProbe(cuda_available=gpus > 0, gpu_count=gpus, control_binary="/bin/true")
