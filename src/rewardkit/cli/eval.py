"""Commands: `rewardkit eval`, `rewardkit compare`, `rewardkit report`."""

from __future__ import annotations

import argparse
from pathlib import Path

from rewardkit.core import atomic
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


def _eval(args: argparse.Namespace) -> int:
    from rewardkit.eval.runner import evaluate

    summary = evaluate(
        model_path=args.model,
        probe_path=args.probe,
        data_path=args.data,
        out_dir=args.out,
        batch_size=args.batch_size,
        reference_path=args.reference,
        device=args.device,
        seed=args.seed,
        replicates=args.replicates,
    )
    strict = summary["bootstrap"]["strict"]
    print(
        f"{summary['n_pairs']} pairs  accuracy {summary['accuracy']:.4f} "
        f"95% [{strict['ci_95'][0]:.4f}, {strict['ci_95'][1]:.4f}]  lower_95 {strict['lower_95']:.4f} "
        f"({'pass' if strict['pass'] else 'no pass'})  tie-aware {summary['accuracy_tie_aware']:.4f}"
    )
    print(f"wrote {Path(args.out) / 'summary.json'}")
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
    ev = subparsers.add_parser("eval", help="score a frozen probe: pairs.jsonl + summary.json with bootstrap")
    ev.add_argument("--model", required=True, help="rewardkit checkpoint or Hugging Face model directory")
    ev.add_argument("--probe", required=True, help="probe.json written by rewardkit data freeze-probe")
    ev.add_argument("--data", required=True, help="evaluation pairs the probe was frozen from")
    ev.add_argument("--out", required=True, help="output directory")
    ev.add_argument(
        "--batch-size", type=_positive, default=16, help="pairs per forward batch (default %(default)s)"
    )
    ev.add_argument(
        "--reference", help="DPO only: the reference model directory, checked against the sidecar"
    )
    ev.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    _bootstrap_options(ev)
    ev.set_defaults(func=_eval)

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
