"""`rewardplane bench` (one service, one sweep) and `rewardplane qualify` (a sweep per deployment mode)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from rewardplane.cli.serve import add_token_options, token_from_args
from rewardplane.core.errors import ConfigError, UsageError


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


SWEEP_ARGS = (
    ("--batch", _ints, "items per request (default %(default)s)"),
    ("--concurrency", _ints, "closed-loop clients (default %(default)s)"),
    ("--requests", int, "minimum measured requests per client (default %(default)s)"),
    ("--warmup", int, "excluded warm-up requests per client (default %(default)s)"),
    ("--repetitions", int, "measurements per point (default %(default)s)"),
    ("--window-s", float, "measurement window (default %(default)s s)"),
    ("--stable-windows", int, "windows that must agree (default %(default)s)"),
    ("--tolerance", float, "stability tolerance (default %(default)s)"),
    ("--max-windows", int, "give up (flag unstable) after this many (default %(default)s)"),
    ("--slo-ms", float, "latency target for goodput"),
    ("--timeout-s", float, "per-request timeout (default %(default)s)"),
    ("--corpus-size", int, "generated corpus size (default %(default)s)"),
    ("--seed", int, "corpus and arrival seed (default %(default)s)"),
)
"""The `bench` flags that are `Sweep` keys (bench/sweep.py holds their one definition and
defaults; `--no-images` is its `images`)."""
SWEEP_FLAGS = tuple(flag[2:].replace("-", "_") for flag, _, _ in SWEEP_ARGS)


class _Default:
    """An unset flag: `Sweep`'s default (or `BenchConfig`'s, for `duration_s`), read only when
    `--help` prints it, so every CLI start does not import the bench package (about a second)."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __str__(self) -> str:
        from rewardplane.bench.sweep import BenchConfig, Sweep

        if self.key in Sweep.model_fields:
            value = Sweep.model_fields[self.key].get_default(call_default_factory=True)
        else:
            value = BenchConfig.__dataclass_fields__[self.key].default
        return (
            ",".join(map(str, value))
            if isinstance(value, list)
            else f"{value:g}"
            if isinstance(value, float)
            else str(value)
        )


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
    for flag, kind, meaning in SWEEP_ARGS:
        default = None if flag == "--slo-ms" else _Default(flag[2:].replace("-", "_"))
        bench.add_argument(flag, type=kind, default=default, help=meaning)
    bench.add_argument("--rate", type=_floats, help="open loop: Poisson arrival rate(s), requests/s")
    bench.add_argument(
        "--duration",
        type=float,
        default=_Default("duration_s"),
        help="open loop: seconds per rate (default %(default)s)",
    )
    add_token_options(bench, "file holding the bearer token (default: $REWARDPLANE_TOKEN)")
    bench.add_argument(
        "--inputs", type=Path, help="JSON lines of {id, prompt, response, image_path|image_b64}"
    )
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


def sweep_from_args(args: argparse.Namespace) -> Any:
    """The `Sweep` the flags ask for (unset flags keep its defaults); a bad value is one line
    naming the flag, exit 2."""
    from rewardplane.bench.sweep import Sweep
    from rewardplane.core.config import parse

    given = {k: v for k in SWEEP_FLAGS if (v := getattr(args, k)) is not None and not isinstance(v, _Default)}
    try:
        return parse(Sweep, {**given, "images": not args.no_images})
    except ConfigError as exc:
        key, _, rest = exc.message.partition(" ")
        colon = ":" if key.endswith(":") else ""
        raise UsageError(f"--{key.rstrip(':').replace('_', '-')}{colon} {rest}") from None


def run_bench_cli(args: argparse.Namespace) -> int:
    from rewardplane.bench.corpus import generate_corpus, load_inputs
    from rewardplane.bench.report import csv_rows, point_table, write_csv
    from rewardplane.bench.sweep import BenchConfig, run_bench
    from rewardplane.core.atomic import write_json

    token = token_from_args(args) or os.environ.get("REWARDPLANE_TOKEN")  # never argv: `ps` shows it
    sweep = sweep_from_args(args)
    if args.inputs is not None:
        corpus, info = load_inputs(args.inputs), {"source": str(args.inputs)}
    else:
        corpus = generate_corpus(sweep.corpus_size, seed=sweep.seed, images=sweep.images)
        info = {"source": "generated", "seed": sweep.seed, "images": sweep.images}
    config = BenchConfig(
        url=args.url,
        scorers=[s.strip() for s in args.scorers.split(",") if s.strip()],
        sweep=sweep,
        rates=args.rate or [],
        token=token,
        gpu_indices=args.gpus,
        mode=args.mode,
        coverage_pass=args.coverage_pass,
        **({} if isinstance(args.duration, _Default) else {"duration_s": args.duration}),
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
