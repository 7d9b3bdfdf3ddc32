"""`rewardplane bench` (one service, one sweep) and `rewardplane qualify` (a sweep per deployment mode)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rewardplane.cli.serve import add_token_options, token_from_args
from rewardplane.core.errors import UsageError


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return values


def register(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser(
        "bench",
        help="load-test a running scoring service (closed or open loop)",
        description="Closed loop by default; --rate switches to open loop (Poisson arrivals). See docs/qualify.md.",
    )
    bench.add_argument("--url", required=True, help="service base URL, e.g. http://127.0.0.1:8000")
    bench.add_argument(
        "--scorers", required=True, help="comma-separated scorer names requested on every item"
    )
    bench.add_argument("--batch", type=_ints, default=[1, 4, 8], help="items per request (default 1,4,8)")
    bench.add_argument(
        "--concurrency", type=_ints, default=[1, 4, 16], help="closed-loop clients (default 1,4,16)"
    )
    bench.add_argument(
        "--requests", type=int, default=60, help="minimum measured requests per client (default 60)"
    )
    bench.add_argument(
        "--warmup", type=int, default=5, help="excluded warm-up requests per client (default 5)"
    )
    bench.add_argument("--repetitions", type=int, default=1, help="measurements per point (default 1)")
    bench.add_argument("--rate", type=_floats, help="open loop: Poisson arrival rate(s), requests/s")
    bench.add_argument(
        "--duration", type=float, default=30.0, help="open loop: seconds per rate (default 30)"
    )
    bench.add_argument("--window-s", type=float, default=5.0, help="measurement window (default 5 s)")
    bench.add_argument("--stable-windows", type=int, default=3, help="windows that must agree (default 3)")
    bench.add_argument("--tolerance", type=float, default=0.10, help="stability tolerance (default 0.10)")
    bench.add_argument("--max-windows", type=int, default=10, help="give up (flag unstable) after this many")
    bench.add_argument("--slo-ms", type=float, help="latency target for goodput")
    bench.add_argument("--timeout-s", type=float, default=60.0, help="per-request timeout (default 60)")
    add_token_options(bench, "file holding the bearer token (default: $REWARDPLANE_TOKEN)")
    bench.add_argument(
        "--inputs", type=Path, help="JSON lines of {id, prompt, response, image_path|image_b64}"
    )
    bench.add_argument("--corpus-size", type=int, default=256, help="generated corpus size (default 256)")
    bench.add_argument("--seed", type=int, default=0, help="corpus and arrival seed (default 0)")
    bench.add_argument(
        "--no-images", action="store_true", help="generated corpus without images (text scorers)"
    )
    bench.add_argument(
        "--coverage-pass", action="store_true", help="score every corpus item once before the sweep"
    )
    bench.add_argument("--gpus", type=lambda t: [int(v) for v in t.split(",")], help="NVML indices to sample")
    bench.add_argument("--mode", help="deployment label when the service has no /v1/deployment")
    bench.add_argument("--out", type=Path, required=True, help="run JSON (schema: bench_run.schema.json)")
    bench.add_argument("--csv", type=Path, help="also write perf_analyzer-style CSV rows here")
    bench.set_defaults(func=run_bench_cli)

    qualify = subparsers.add_parser(
        "qualify",
        help="benchmark every deployment mode of a plan and compare them (throughput, parity, validity)",
        description="Starts and stops each deployment itself (`rewardplane serve --deploy`). See docs/qualify.md.",
    )
    qualify.add_argument(
        "--plan", type=Path, required=True, help="plan YAML (e.g. benchmarks/qualify_h200.yaml)"
    )
    qualify.add_argument("--out", type=Path, required=True, help="output directory")
    qualify.add_argument(
        "overrides",
        nargs="*",
        help="dotted key=value plan overrides, e.g. sweep.window_s=2 goals.mps_vs_shared_items_per_s=1.2",
    )
    qualify.add_argument(
        "--dry-run", action="store_true", help="write the deploy files, print the plan, run nothing"
    )
    qualify.set_defaults(func=run_qualify_cli)


def run_bench_cli(args: argparse.Namespace) -> int:
    from rewardplane.bench.corpus import generate_corpus, load_inputs
    from rewardplane.bench.report import csv_rows, point_table, write_csv
    from rewardplane.bench.sweep import BenchConfig, run_bench
    from rewardplane.bench.windows import WindowPolicy
    from rewardplane.core.atomic import write_json

    token = token_from_args(args) or os.environ.get("REWARDPLANE_TOKEN")  # never argv: `ps` shows it
    for name in ("requests", "repetitions", "corpus_size", "stable_windows", "max_windows"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        raise UsageError("--warmup must be >= 0")
    try:
        policy = WindowPolicy(args.window_s, args.stable_windows, args.tolerance, args.max_windows)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.inputs is not None:
        corpus, info = load_inputs(args.inputs), {"source": str(args.inputs)}
    else:
        corpus = generate_corpus(args.corpus_size, seed=args.seed, images=not args.no_images)
        info = {"source": "generated", "seed": args.seed, "images": not args.no_images}
    config = BenchConfig(
        url=args.url,
        scorers=[s.strip() for s in args.scorers.split(",") if s.strip()],
        batches=args.batch,
        concurrencies=args.concurrency,
        rates=args.rate or [],
        duration_s=args.duration,
        requests=args.requests,
        warmup=args.warmup,
        repetitions=args.repetitions,
        policy=policy,
        slo_ms=args.slo_ms,
        token=token,
        timeout_s=args.timeout_s,
        seed=args.seed,
        gpu_indices=args.gpus,
        mode=args.mode,
        coverage_pass=args.coverage_pass,
    )
    run = run_bench(config, corpus, info)
    write_json(args.out, run)
    if args.csv is not None:
        write_csv(args.csv, csv_rows(run["points"]))
    print(point_table(run["points"]))
    totals = run["totals"]
    print(
        f"\n{totals['ok']}/{totals['requests']} requests ok; regime(s): {', '.join(totals['regimes'])}; "
        f"unstable points: {totals['unstable_points']}; wrote {args.out}"
    )
    if totals["failed"]:
        reasons = ", ".join(f"{k}={v}" for k, v in totals["failures_by_reason"].items())
        print(f"FAILED requests: {totals['failed']} ({reasons})", file=sys.stderr)
        return 1
    return 0


def run_qualify_cli(args: argparse.Namespace) -> int:
    from rewardplane.bench.qualify import dry_run, load_plan, qualify

    plan = load_plan(args.plan, args.overrides)
    if args.dry_run:
        print(dry_run(plan, args.out))
        return 0
    summary = qualify(plan, args.out)
    for line in summary["failures"]:
        print(f"FAIL: {line}", file=sys.stderr)
    print(f"wrote {args.out / 'summary.json'} and {args.out / 'report.md'}")
    return 0 if summary["passed"] else 1
