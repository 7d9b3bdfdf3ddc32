"""An opt-in torch.profiler window inside a live worker, for "where does the GPU time go".

Set `REWARDPLANE_WORKER_PROFILE=DIR` in the environment of `rewardplane serve --deploy` (a qualify
plan's `server.env` does this). Every worker then waits until it has run
`REWARDPLANE_WORKER_PROFILE_AFTER_BATCHES` batches (default 20, so start-up, warm-up and the first
requests are behind it), records CPU and CUDA activity for `REWARDPLANE_WORKER_PROFILE_SECONDS`
(default 2), and writes `DIR/<worker>-<pid>.trace.json.gz`, a Chrome/Perfetto trace that
`rewardplane.bench.trace` summarises (GPU busy time, overlap of streams, top kernels).

The window is triggered by batches served, not by wall time, because how long a deployment
takes to start varies by minutes with the model and the machine; a batch count does not.
Profiling costs host time while it records, so the window's throughput is not a measurement;
the trace's kernel times and gaps are.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rewardplane.core.atomic import write_bytes

log = logging.getLogger("rewardplane.deploy.profiling")

ENV_DIR = "REWARDPLANE_WORKER_PROFILE"
ENV_AFTER_BATCHES = "REWARDPLANE_WORKER_PROFILE_AFTER_BATCHES"
ENV_SECONDS = "REWARDPLANE_WORKER_PROFILE_SECONDS"


@dataclass(frozen=True)
class ProfileWindow:
    directory: Path
    after_batches: int = 20
    seconds: float = 2.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ProfileWindow | None:
        """The configured window, or None when profiling is off; bad values are a clear error."""
        env = dict(os.environ if env is None else env)
        directory = env.get(ENV_DIR)
        if not directory:
            return None
        try:
            after = int(env.get(ENV_AFTER_BATCHES, cls.after_batches))
            seconds = float(env.get(ENV_SECONDS, cls.seconds))
        except ValueError as exc:
            raise ValueError(f"{ENV_AFTER_BATCHES} / {ENV_SECONDS}: {exc}") from None
        if after < 0 or not 0 < seconds <= 60:
            raise ValueError(f"{ENV_AFTER_BATCHES} must be >= 0 and {ENV_SECONDS} in (0, 60]")
        return cls(Path(directory), after, seconds)


async def profile_window(window: ProfileWindow, batches_run: Callable[[], int], name: str) -> Path:
    """Wait for `after_batches` batches, record `seconds`, write the gzipped trace; its path."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    while batches_run() < window.after_batches:
        await asyncio.sleep(0.05)
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    prof = profile(activities=activities)
    prof.start()
    log.info("profiling worker %s for %.1f s", name, window.seconds)
    try:
        await asyncio.sleep(window.seconds)
    finally:
        prof.stop()
    out = window.directory / f"{name}-{os.getpid()}.trace.json.gz"
    with tempfile.TemporaryDirectory() as tmp:  # the profiler exports to a path, not a stream
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        write_bytes(out, gzip.compress(raw.read_bytes()))
    log.info("worker %s trace written to %s", name, out)
    return out
