"""Commands: `rewardkit compare`, `rewardkit report`."""

from __future__ import annotations

import argparse
from pathlib import Path

from rewardkit import atomic
from rewardkit.eval.bootstrap import DEFAULT_REPLICATES, DEFAULT_SEED


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _compare(args: argparse.Namespace) -> int:
    from rewardkit.eval.compare import compare_pairs, format_table

    comparison = compare_pairs(args.a, args.b, seed=args.seed, replicates=args.replicates)
    out = Path(args.out) / "comparison.json"
    atomic.write_json(out, comparison)
    print(format_table(comparison))
    print(f"wrote {out}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from rewardkit.eval.report import build_report

    path = build_report(args.run_dir, args.out)
    print(f"report: {path}")
    print(f"markdown: {path.with_suffix('.md')}")
    return 0


def _bootstrap_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="bootstrap seed (default %(default)s)")
    parser.add_argument(
        "--replicates",
        type=_positive,
        default=DEFAULT_REPLICATES,
        help="bootstrap replicates (default %(default)s)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    cmp_parser = subparsers.add_parser(
        "compare", help="paired bootstrap + exact McNemar of B vs A on one probe"
    )
    cmp_parser.add_argument("a", help="A/pairs.jsonl (baseline)")
    cmp_parser.add_argument("b", help="B/pairs.jsonl (candidate)")
    cmp_parser.add_argument("--out", required=True, help="directory for comparison.json")
    _bootstrap_options(cmp_parser)
    cmp_parser.set_defaults(func=_compare)

    rep = subparsers.add_parser("report", help="HTML + Markdown report of a run or an eval directory")
    rep.add_argument("run_dir", help="run directory (metrics.jsonl, eval/step-*/, config.yaml)")
    rep.add_argument("--out", help="output directory (default RUN_DIR/report)")
    rep.set_defaults(func=_report)
