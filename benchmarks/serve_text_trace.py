"""A GPU timeline of a served scorer's packed forwards, for `benchmarks/serve_text.py --trace DIR`.

Why: a server that falls short of the in-process ceiling leaves the GPU idle somewhere, and
utilisation sampled by nvidia-smi cannot say where. This records, for every packed forward in
the server process, when the scoring thread started planning it, started and finished launching
it (host clock) and when the GPU started and finished it (CUDA events on the same clock). From
that a reader sees the idle time between forwards, whether a forward's kernels were launched
before the GPU reached them, and how long each forward ran against the in-process rate.

serve_text.py puts a `sitecustomize.py` on the server's PYTHONPATH that calls `install` when
`RK_TRACE_FORWARDS` names an output file; nothing in rewardplane knows about it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from itertools import pairwise
from pathlib import Path

ENV = "RK_TRACE_FORWARDS"
DUMP_EVERY = 16


def install(path: str) -> list[dict]:
    """Wrap `plan_packed` and `packed_scores` of rewardplane.models.packed_scoring (looked up as
    module globals by `score_sequence_chunks`, so replacing the attributes is enough). Returns the
    live list of finished records (a forward is added once a later one finds it done)."""
    import torch

    from rewardplane.models import packed_scoring

    if not torch.cuda.is_available():
        return []
    out = Path(f"{path}.{os.getpid()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    records: list[dict] = []
    pending: list[tuple[dict, torch.cuda.Event, torch.cuda.Event]] = []
    planned: dict[int, float] = {}  # thread id → host time its last plan started
    ref: dict[str, object] = {}

    def reference() -> tuple[torch.cuda.Event, float]:
        if not ref:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            event.synchronize()
            ref["event"], ref["host"] = event, time.perf_counter()
        return ref["event"], ref["host"]  # type: ignore[return-value]

    plan_packed, packed_scores = packed_scoring.plan_packed, packed_scoring.packed_scores

    def traced_plan(*args, **kwargs):
        planned[threading.get_ident()] = time.perf_counter()
        return plan_packed(*args, **kwargs)

    def traced_scores(backbone, head, plan):
        zero, host_zero = reference()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        launch = time.perf_counter()
        start.record()
        scores = packed_scores(backbone, head, plan)
        end.record()
        row = {
            "thread": threading.get_ident() % 10_000,
            # host times on the monotonic clock every process shares (time.perf_counter)
            "plan_start": planned.get(threading.get_ident(), launch),
            "launch_start": launch,
            "launch_end": time.perf_counter(),
            "tokens": plan.computed_tokens,
            "items": int(plan.score_at.numel()),
        }
        with lock:
            pending.append((row, start, end))
            ready = [p for p in pending if p[2].query()]
            for p in ready:
                pending.remove(p)
                p[0]["gpu_start"] = host_zero + zero.elapsed_time(p[1]) / 1e3
                p[0]["gpu_end"] = host_zero + zero.elapsed_time(p[2]) / 1e3
                records.append(p[0])
            if ready and len(records) % DUMP_EVERY < len(ready):
                tmp = out.with_suffix(".tmp")
                tmp.write_text(json.dumps(records))
                tmp.replace(out)
        return scores

    packed_scoring.plan_packed, packed_scoring.packed_scores = traced_plan, traced_scores
    return records


SWITCH_ENV = "RK_SWITCH_INTERVAL"
"""With it set, the server's `sys.setswitchinterval` (seconds): how long a thread waiting for the
GIL lets the holder run before asking it to drop (5 ms by default)."""


def sitecustomize_dir(root: Path) -> Path:
    """A directory holding a `sitecustomize.py` that installs the trace where `ENV` is set and
    sets the switch interval where `SWITCH_ENV` is."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "sitecustomize.py").write_text(
        "import os\n"
        "import sys\n"
        f"if os.environ.get({SWITCH_ENV!r}):\n"
        f"    sys.setswitchinterval(float(os.environ[{SWITCH_ENV!r}]))\n"
        f"if os.environ.get({ENV!r}):\n"
        "    import serve_text_trace\n"
        f"    serve_text_trace.install(os.environ[{ENV!r}])\n"
    )
    return root


def load(path: Path) -> list[dict]:
    """Every record the server processes wrote under `path` (one file per process)."""
    return [r for f in sorted(path.parent.glob(f"{path.name}.*.json")) for r in json.loads(f.read_text())]


def summarise(records: list[dict], start: float, end: float) -> dict[str, float]:
    """GPU busy fraction, idle gaps and launch slack of the forwards the GPU ran within [start,
    end] (host perf_counter seconds: the timed phase)."""
    rows = sorted(
        (r for r in records if start <= r["gpu_start"] and r["gpu_end"] <= end), key=lambda r: r["gpu_start"]
    )
    if len(rows) < 2:
        return {}
    span = rows[-1]["gpu_end"] - rows[0]["gpu_start"]
    busy = sum(r["gpu_end"] - r["gpu_start"] for r in rows)
    gaps = [max(0.0, b["gpu_start"] - a["gpu_end"]) for a, b in pairwise(rows)]
    # a forward whose launch finished after the GPU started it ran while still being launched
    late = [r["launch_end"] - r["gpu_start"] for r in rows]
    return {
        "forwards": len(rows),
        "gpu_busy": busy / span,
        "ms_per_forward": 1e3 * busy / len(rows),
        "tokens_per_forward": sum(r["tokens"] for r in rows) / len(rows),
        "gpu_tokens_per_s": sum(r["tokens"] for r in rows) / busy,
        "mean_gap_ms": 1e3 * sum(gaps) / len(gaps),
        "max_gap_ms": 1e3 * max(gaps),
        "launch_ms": 1e3 * sum(r["launch_end"] - r["launch_start"] for r in rows) / len(rows),
        "plan_ms": 1e3 * sum(r["launch_start"] - r["plan_start"] for r in rows) / len(rows),
        "launch_late_ms": 1e3 * sum(max(0.0, x) for x in late) / len(rows),
    }
