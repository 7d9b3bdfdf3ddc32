"""Benchmark `rewardplane data validate`: rows/s without a tokenizer, pairs/s with a fast one,
and peak RSS while streaming a large (default 1M-row) JSONL file.

CPU only (data validation never touches the GPU). Each measurement runs in a fresh
subprocess so that its peak RSS is its own, not the file generator's.

    PYTHONPATH=src python3 benchmarks/data_validate.py --out data_validate.json          # 1M rows
    PYTHONPATH=src python3 benchmarks/data_validate.py --smoke --out data_validate.json  # 20k rows

Rates are reported per wall second and per CPU second of the validating process; on a
shared machine the second is the one to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHUNK = 10_000


def rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def generate(path: Path, rows: int) -> None:
    """Synth rows written chunk by chunk (each chunk its own seed, so ids stay unique)."""
    from rewardplane.data.synth import generate_rows

    with open(path, "w", encoding="utf-8") as handle:
        for seed, start in enumerate(range(0, rows, CHUNK)):
            for row in generate_rows(min(CHUNK, rows - start), seed=seed):
                handle.write(json.dumps(row) + "\n")


def measure(path: str, tokenizer_spec: str | None, limit: int | None) -> dict:
    """One validation pass (the `validate` pipeline); runs inside the child process."""
    import itertools

    from rewardplane.data.pipeline import Summary, iter_validated
    from rewardplane.data.tokenize import TokenizeSettings, load_tokenizer

    tokenizer = load_tokenizer(tokenizer_spec) if tokenizer_spec else None
    if tokenizer is not None:
        from rewardplane.data.normalize import normalize_row
        from rewardplane.data.synth import generate_rows
        from rewardplane.data.tokenize import tokenize_pair

        tokenize_pair(normalize_row(generate_rows(1)[0]), tokenizer)  # warm-up (template compile)
    summary = Summary()
    rss_samples = []
    start_rss = rss_mb()
    start, start_cpu = time.perf_counter(), time.process_time()
    items = iter_validated(path, tokenizer, TokenizeSettings())
    for item in itertools.islice(items, limit):
        summary.add(item)
        if summary.rows % 100_000 == 0:
            rss_samples.append([summary.rows, round(rss_mb(), 1)])
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
    return {
        "rows": summary.rows,
        "valid": summary.valid,
        "seconds": round(seconds, 3),
        "rows_per_s": round(summary.rows / seconds, 1),
        "cpu_seconds": round(cpu_seconds, 3),
        "rows_per_cpu_s": round(summary.rows / cpu_seconds, 1),
        "rss_start_mb": round(start_rss, 1),
        "rss_by_rows_mb": rss_samples,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def run_child(path: Path, tokenizer: str | None, limit: int | None) -> dict:
    argv = [sys.executable, __file__, "--child", str(path)]
    if tokenizer:
        argv += ["--tokenizer", tokenizer]
    if limit:
        argv += ["--limit", str(limit)]
    done = subprocess.run(argv, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one pair at a time: no thread pool
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--tokenized-rows", type=int, default=20_000, help="rows for the tokenizer pass")
    parser.add_argument(
        "--tokenizer", default="builtin", help="fast tokenizer: a local directory or 'builtin'"
    )
    parser.add_argument("--smoke", action="store_true", help="20k rows, 5k tokenized (CI-sized)")
    parser.add_argument("--out", default=None, help="write the JSON result here")
    parser.add_argument("--input", default=None, help="validate this JSONL file instead of generating one")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        tokenizer = args.tokenizer if "--tokenizer" in sys.argv else None
        print(json.dumps(measure(args.child, tokenizer, args.limit)))
        return
    if args.smoke:
        args.rows, args.tokenized_rows = 20_000, 5_000

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.input) if args.input else Path(tmp) / "rows.jsonl"
        if not args.input:
            started = time.perf_counter()
            generate(path, args.rows)
            print(f"generated {args.rows} rows in {time.perf_counter() - started:.1f}s", file=sys.stderr)
        size_mib = path.stat().st_size / 2**20
        plain = run_child(path, None, None)
        print(
            f"validate, no tokenizer: {plain['rows_per_s']:.0f} rows/s, peak RSS {plain['peak_rss_mb']} MiB",
            file=sys.stderr,
        )
        tokenized = run_child(path, args.tokenizer, args.tokenized_rows)
        print(f"validate, tokenizer {args.tokenizer}: {tokenized['rows_per_s']:.0f} pairs/s", file=sys.stderr)

    import tokenizers
    import transformers

    result = {
        "benchmark": "data_validate",
        "file": {
            "rows": plain["rows"],
            "mib": round(size_mib, 1),
            "source": args.input or "rewardplane.data.synth",
        },
        "no_tokenizer": plain,
        "with_tokenizer": {"tokenizer": args.tokenizer, **tokenized},
        "machine": {
            "cpu_count": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
        "goal": {"rows_per_s_no_tokenizer": 20_000, "met": plain["rows_per_s"] >= 20_000},
    }
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
