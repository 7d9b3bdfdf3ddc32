"""`rewardplane bench` (one service, one sweep) and `rewardplane qualify` (a sweep per deployment mode)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from rewardplane.cli.serve import add_token_options, token_from_args
from rewardplane.core.errors import ConfigError, UsageError
from rewardplane.core.outputs import add_overwrite_option, check_out_dir, check_out_file


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


SWEEP_FLAGS = (
    "batch", "concurrency", "requests", "warmup", "repetitions", "window_s", "stable_windows",
    "tolerance", "max_windows", "slo_ms", "timeout_s", "corpus_size", "seed",
)  # fmt: skip
"""The `bench` flags that are `Sweep` keys (`--no-images` is its `images`). Their types, meanings
and defaults come from the model (bench/sweep.py), read only when a flag is parsed or `--help`
prints: importing the bench package at every CLI start would cost about a second."""


def _sweep_field(key: str) -> Any:
    from rewardplane.bench.sweep import BenchConfig, Sweep

    return Sweep.model_fields.get(key) or BenchConfig.__dataclass_fields__[key]


class _Default:
    """An unset flag: its `Sweep` (or, for `duration_s`, `BenchConfig`) default."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __str__(self) -> str:
        field = _sweep_field(self.key)
        value = (
            field.get_default(call_default_factory=True) if hasattr(field, "get_default") else field.default
        )
        return (
            ",".join(map(str, value))
            if isinstance(value, list)
            else "none"
            if value is None
            else f"{value:g}"
        )


class _Value:
    """The flag's type: comma-separated positive integers for a list, else the field's number type."""

    def __init__(self, key: str) -> None:
        self.key = self.__name__ = key

    def __call__(self, text: str) -> Any:
        annotation = str(_sweep_field(self.key).annotation)
        return _ints(text) if "list" in annotation else float(text) if "float" in annotation else int(text)


class _SweepHelp(argparse.HelpFormatter):
    """A sweep flag's help (its `help` is the key) is its `Sweep` field's meaning and default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if isinstance(action.default, _Default):
            field = _sweep_field(action.default.key)
            meaning = getattr(field, "description", None) or "Open loop: seconds per rate."
            return f"{meaning} (default {str(action.default).replace('%', '%%')})"
        return super()._get_help_string(action)


def register(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser(
        "bench",
        help="load-test a running scoring service (closed or open loop)",
        description="Closed loop by default; --rate switches to open loop (Poisson arrivals). See docs/qualify.md.",
        formatter_class=_SweepHelp,
    )
    bench.add_argument("--url", required=True, help="service base URL, e.g. http://127.0.0.1:8000")
    bench.add_argument(
        "--scorers", required=True, help="comma-separated scorer names requested on every item"
    )
    for key in SWEEP_FLAGS:
        bench.add_argument("--" + key.replace("_", "-"), type=_Value(key), default=_Default(key), help=key)
    bench.add_argument("--rate", type=_floats, help="open loop: Poisson arrival rate(s), requests/s")
    bench.add_argument("--duration", type=float, default=_Default("duration_s"), help="duration_s")
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
    add_overwrite_option(bench, "an existing --out or --csv file")
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
    add_overwrite_option(qualify, "what is in a non-empty --out folder")
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

    check_out_file(args.out, overwrite=args.overwrite)
    if args.csv is not None:
        check_out_file(args.csv, overwrite=args.overwrite, option="--csv")
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

    plan = load_plan(args.plan, args.overrides)  # the plan's errors first, then where it would write
    check_out_dir(args.out, overwrite=args.overwrite)
    if args.dry_run:
        print(dry_run(plan, args.out))
        return 0
    summary = qualify(plan, args.out)
    for line in summary["failures"]:
        print(f"FAIL: {line}", file=sys.stderr)
    print(f"wrote {args.out / 'summary.json'} and {args.out / 'report.md'}")
    return 0 if summary["passed"] else 1
