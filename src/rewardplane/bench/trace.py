"""Summarise a torch.profiler Chrome trace: how busy the GPU was, on which streams, doing what.

A qualify report says *that* a layout reached N % GPU utilisation (NVML's "a kernel was
running" sample); a trace says *why*: the busy time as the union of kernel intervals, how
much of it ran on two streams at once, where the idle gaps were and how long, and which
kernels took the time. `python -m rewardplane.bench.trace TRACE.json.gz` prints the summary.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
_GEMM = re.compile(r"gemm|cutlass|xmma|cublas|nvjet|matmul", re.IGNORECASE)
_ATTENTION = re.compile(r"flash|fmha|attention|sdpa", re.IGNORECASE)


def _load(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt", encoding="utf-8") as f:
        return list(json.load(f).get("traceEvents", []))


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _length(intervals: list[tuple[float, float]]) -> float:
    return float(sum(b - a for a, b in intervals))


def _kind(name: str) -> str:
    if _GEMM.search(name):
        return "gemm"
    if _ATTENTION.search(name):
        return "attention"
    return "other"


def summarize_trace(path: str | Path, top: int = 15) -> dict[str, Any]:
    """Busy/idle/overlap of the GPU over the trace's window, in ms; see the module docstring."""
    events = [e for e in _load(path) if e.get("ph") == "X" and "dur" in e and "ts" in e]
    if not events:
        raise ValueError(f"{path}: no complete ('X') events in the trace")
    t0 = min(float(e["ts"]) for e in events)
    t1 = max(float(e["ts"]) + float(e["dur"]) for e in events)
    window_us = t1 - t0
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    intervals = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in gpu]
    busy = _union(intervals)
    gaps = np.array([b[0] - a[1] for a, b in zip(busy, busy[1:], strict=False)], dtype=np.float64)
    by_stream: dict[str, list[tuple[float, float]]] = defaultdict(list)
    by_name: dict[str, list[float]] = defaultdict(list)
    by_kind: dict[str, float] = defaultdict(float)
    for e, iv in zip(gpu, intervals, strict=True):
        args = e.get("args") or {}
        by_stream[str(args.get("stream", "?"))].append(iv)
        by_name[str(e.get("name", "?"))].append(float(e["dur"]))
        by_kind[_kind(str(e.get("name", ""))) if e.get("cat") == "kernel" else e["cat"]] += float(e["dur"])
    stream_busy = {s: _length(_union(iv)) for s, iv in by_stream.items()}
    busy_us = _length(busy)
    gpu_time_us = float(sum(d for ds in by_name.values() for d in ds))
    launches = [e for e in events if e.get("cat") == "cuda_runtime" and "Launch" in str(e.get("name", ""))]
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    ms = 1e-3
    return {
        "trace": str(path),
        "window_ms": window_us * ms,
        "gpu": {
            "kernels": sum(1 for e in gpu if e.get("cat") == "kernel"),
            "busy_ms": busy_us * ms,
            "busy_fraction": busy_us / window_us if window_us > 0 else None,
            # stream time beyond the union: how much ran while another stream was also running
            "concurrent_ms": (sum(stream_busy.values()) - busy_us) * ms,
            "streams": {
                s: {"busy_ms": v * ms, "events": len(by_stream[s])} for s, v in sorted(stream_busy.items())
            },
            "time_by_kind_ms": {k: v * ms for k, v in sorted(by_kind.items())},
            "idle_ms": (window_us - busy_us) * ms,
            "gaps": {
                "count": int(gaps.size),
                "over_100us": int((gaps > 100).sum()),
                "over_1ms": int((gaps > 1000).sum()),
                "idle_in_gaps_over_1ms_ms": float(gaps[gaps > 1000].sum()) * ms,
                "p50_us": float(np.median(gaps)) if gaps.size else None,
                "max_ms": float(gaps.max()) * ms if gaps.size else None,
            },
            "top_kernels": [
                {
                    "name": name[:120],
                    "count": len(durs),
                    "total_ms": sum(durs) * ms,
                    "share": sum(durs) / gpu_time_us if gpu_time_us else None,
                }
                for name, durs in ranked
            ],
        },
        "host": {
            "kernel_launches": len(launches),
            "launch_ms": float(sum(float(e["dur"]) for e in launches)) * ms,
        },
    }


def plot_summaries(summaries: list[dict[str, Any]], out: str | Path, labels: list[str] | None = None) -> Path:
    """One bar per trace: the window split into GPU time by kind and idle (stream time beyond
    the busy union, i.e. overlap, makes a bar longer than 100 %, which is the point)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = ["gemm", "attention", "other", "gpu_memcpy", "gpu_memset"]
    labels = labels or [Path(s["trace"]).name.split(".")[0] for s in summaries]
    fig, ax = plt.subplots(figsize=(8, 1.4 + 0.6 * len(summaries)))
    for row, s in enumerate(summaries):
        left = 0.0
        for kind in [*kinds, "idle"]:
            ms = s["gpu"]["idle_ms"] if kind == "idle" else s["gpu"]["time_by_kind_ms"].get(kind, 0.0)
            share = 100 * ms / s["window_ms"]
            color = "lightgrey" if kind == "idle" else f"C{kinds.index(kind)}"
            ax.barh(row, share, left=left, color=color, label=kind if row == 0 else None)
            left += share
    ax.set_yticks(range(len(summaries)), labels)
    ax.invert_yaxis()
    ax.axvline(100, color="black", linewidth=0.8)
    ax.set_xlabel("% of the profiled window (kernel time by kind, then idle)")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m rewardplane.bench.trace", description=__doc__.splitlines()[0]
    )
    parser.add_argument("traces", nargs="+", help="torch.profiler Chrome traces (.json or .json.gz)")
    parser.add_argument(
        "--plot", type=Path, help="also write a PNG: each window split by kernel kind and idle"
    )
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    summaries = [summarize_trace(p) for p in args.traces]
    print(json.dumps(summaries, indent=2))
    if args.plot:
        plot_summaries(summaries, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
