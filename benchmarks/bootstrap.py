"""Benchmark the evaluation bootstrap: speed at 10,000 × 512, bounded memory at 10,000 × 100,000.

The bootstrap is NumPy on the CPU, so the same command is the full configuration on any
machine (the GPU host runs it on its CPU cores). For each size it records the wall time of
`bootstrap_mean` (best of --repeats), the peak memory NumPy allocated during the call
(tracemalloc; NumPy reports its buffers to it) next to what a single-call index array would
need, and — at the small size — that the chunked result equals the single-call result.

    PYTHONPATH=src python3 benchmarks/bootstrap.py --out bootstrap.json           # full
    PYTHONPATH=src python3 benchmarks/bootstrap.py --smoke --out bootstrap.json   # ~5 s
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import tracemalloc

import numpy as np

from rewardplane.core.resample import DEFAULT_REPLICATES, default_chunk_rows
from rewardplane.eval.bootstrap import bootstrap_mean


def _values(n: int) -> np.ndarray:
    return (np.random.default_rng(0).random(n) < 0.7).astype(np.float64)


def measure(n: int, replicates: int, repeats: int) -> dict:
    values = _values(n)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        block = bootstrap_mean(values, statistic="accuracy", replicates=replicates)
        times.append(time.perf_counter() - start)
    tracemalloc.start()
    bootstrap_mean(values, statistic="accuracy", replicates=replicates)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "n": n,
        "replicates": replicates,
        "chunk_rows": min(default_chunk_rows(n), replicates),
        "seconds_best": min(times),
        "seconds_all": times,
        "peak_traced_mib": peak / 2**20,
        "single_call_index_mib": replicates * n * 8 / 2**20,
        "point": block["point"],
        "ci_95": block["ci_95"],
        "index_sha256": block["index_sha256"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="result JSON path")
    parser.add_argument(
        "--smoke", action="store_true", help="small large-case (10,000 × 5,000) for a quick check"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of the small case")
    args = parser.parse_args()

    small = measure(512, DEFAULT_REPLICATES, args.repeats)
    single = bootstrap_mean(_values(512), statistic="accuracy", chunk_rows=DEFAULT_REPLICATES)
    chunked = bootstrap_mean(_values(512), statistic="accuracy", chunk_rows=7)
    small["chunked_equals_single"] = single == chunked
    large = measure(5_000 if args.smoke else 100_000, DEFAULT_REPLICATES, 1)
    result = {
        "benchmark": "eval.bootstrap",
        "smoke": args.smoke,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
        },
        "small": small,
        "large": large,
    }
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
    for name in ("small", "large"):
        r = result[name]
        print(
            f"{r['replicates']} x {r['n']}: {r['seconds_best']:.3f} s, peak {r['peak_traced_mib']:.0f} MiB "
            f"(single call would hold {r['single_call_index_mib']:.0f} MiB of indices)"
        )
    print(f"chunked == single at 10,000 x 512: {small['chunked_equals_single']}")


if __name__ == "__main__":
    main()
