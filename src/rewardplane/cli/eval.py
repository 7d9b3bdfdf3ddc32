"""Commands: `rewardplane eval`, `rewardplane compare`, `rewardplane report`."""

from __future__ import annotations

import argparse
from pathlib import Path

from rewardplane.core import atomic
from rewardplane.core.errors import UsageError
from rewardplane.core.outputs import add_overwrite_option, check_out_dir
from rewardplane.core.progress import DEFAULT_EVERY_S
from rewardplane.eval.bootstrap import DEFAULT_REPLICATES, DEFAULT_SEED
from rewardplane.eval.settings import EvalSettings


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _say_overlap(entry: dict | None, who: str = "the model") -> None:
    """The training-overlap line: on stdout when none was found, else a warning on stderr."""
    import sys

    from rewardplane.data.overlap import is_clean, overlap_line

    if entry is None:
        return
    if is_clean(entry):
        print(overlap_line(entry, who))
    else:
        print(f"rewardplane: warning: {overlap_line(entry, who)} (--strict-overlap refuses)", file=sys.stderr)


def _compare(args: argparse.Namespace) -> int:
    from rewardplane.eval.benchmarks.runner import is_examples_file
    from rewardplane.eval.compare import compare_examples, compare_pairs, format_benchmark_table, format_table

    check_out_dir(args.out, overwrite=args.overwrite)
    if is_examples_file(args.a) or is_examples_file(args.b):
        if args.strict_overlap:
            raise UsageError(
                "--strict-overlap applies to probe evaluations; benchmark examples are not checked"
            )
        comparison = compare_examples(args.a, args.b, seed=args.seed, replicates=args.replicates)
        table = format_benchmark_table(comparison)
    else:
        comparison = compare_pairs(
            args.a, args.b, seed=args.seed, replicates=args.replicates, strict_overlap=args.strict_overlap
        )
        table = format_table(comparison)
    out = Path(args.out) / "comparison.json"
    atomic.write_json(out, comparison)
    print(table)
    for side, entry in comparison.get("train_overlap", {}).items():
        _say_overlap(entry, f"model {side.upper()}")
    print(f"wrote {out}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from rewardplane.eval.report import build_report

    if not Path(args.run_dir).is_dir():
        raise UsageError(f"{args.run_dir}: no such folder (give a run, eval or compare folder)")
    out = check_out_dir(args.out or Path(args.run_dir) / "report", overwrite=args.overwrite)
    path = build_report(args.run_dir, out)
    print(f"report: {path}")
    print(f"markdown: {path.with_suffix('.md')}")
    return 0


def _settings(args: argparse.Namespace) -> EvalSettings:
    return EvalSettings(
        batch_size=args.batch_size, device=args.device, reference_path=args.reference, dtype=args.dtype,
        max_batch_tokens=args.max_batch_tokens, seed=args.seed, replicates=args.replicates,
        progress=not args.no_progress, progress_every_s=args.progress_every,
    )  # fmt: skip


def _check_benchmark_data(name: str, data: str) -> None:
    """A missing `--data` answered with where the benchmark's files come from (before torch loads)."""
    from rewardplane.eval.benchmarks.runner import get

    base, colon, _split = data.rpartition(":")
    if Path(data).exists() or (colon and Path(base).is_dir()):
        return
    source = get(name).SOURCE
    raise UsageError(
        f"--data {data}: no such file or folder. {get(name).TITLE} is {source['dataset']}; with network"
        f" access: {source['fetch']}, then --data {source['file']} (docs/benchmarks.md#getting-the-data);"
        f" a few rows in the schema: {source['sample']}",
        code="no_data",
    )


def _eval_benchmark(args: argparse.Namespace) -> int:
    from rewardplane.eval.benchmarks.runner import evaluate_benchmark

    _check_benchmark_data(args.benchmark, args.data)
    summary = evaluate_benchmark(
        benchmark=args.benchmark,
        data_path=args.data,
        model_path=args.model,
        out_dir=args.out,
        options=_settings(args),
        max_length=args.max_length,
        truncation=args.truncation,
    )
    data = summary["data"]
    print(
        f"{data['rows']} rows read, {data['valid']} scored, {data['rejected']} rejected "
        f"{data['rejections'] or ''}, {data['truncated_examples']} with a truncated text"
    )
    for name, entry in summary["aggregates"].items():
        block = entry["bootstrap"]
        print(
            f"{name:<28} {entry['score']:.4f}  95% [{block['ci_95'][0]:.4f}, {block['ci_95'][1]:.4f}]  "
            f"lower_95 {block['lower_95']:.4f}  n {entry['n']}"
        )
    for name, entry in summary["subsets"].items():
        block = entry["bootstrap"]
        print(
            f"  {name:<26} {entry['value']:.4f}  95% [{block['ci_95'][0]:.4f}, {block['ci_95'][1]:.4f}]  "
            f"lower_95 {block['lower_95']:.4f}  n {entry['n']}"
        )
    print(summary["headline"]["sentence"])
    print(f"wrote {Path(args.out) / 'summary.json'}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    check_out_dir(args.out, overwrite=args.overwrite)
    if args.benchmark is not None:
        if args.probe is not None:
            raise UsageError("--probe is for rewardplane's own pairs; a --benchmark evaluation takes none")
        if args.strict_overlap:
            raise UsageError(
                "--strict-overlap applies to probe evaluations; benchmark examples are not checked"
            )
        return _eval_benchmark(args)
    if args.probe is None:
        raise UsageError("--probe is required (or give --benchmark rewardbench|rewardbench2|rm-bench)")
    from rewardplane.data.reader import resolve_source

    if not resolve_source(args.data)[0].exists():
        raise UsageError(f"--data {args.data} does not exist", code="no_such_path")
    from rewardplane.eval.runner import evaluate  # torch: only once the paths are known to be there

    summary = evaluate(
        model_path=args.model,
        probe_path=args.probe,
        data_path=args.data,
        out_dir=args.out,
        options=_settings(args),
        strict_overlap=args.strict_overlap,
    )
    strict = summary["bootstrap"]["strict"]
    print(
        f"{summary['n_pairs']} pairs  accuracy {summary['accuracy']:.4f} "
        f"95% [{strict['ci_95'][0]:.4f}, {strict['ci_95'][1]:.4f}]  lower_95 {strict['lower_95']:.4f} "
        f"({'pass' if strict['pass'] else 'no pass'})  tie-aware {summary['accuracy_tie_aware']:.4f}"
    )
    _say_overlap(summary["train_overlap"])
    print(f"wrote {Path(args.out) / 'summary.json'}")
    return 0


def _strict_overlap_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--strict-overlap",
        action="store_true",
        help="refuse (exit 2) when evaluated pairs are in the model's training data, or when that"
        " cannot be checked (default: a warning, and the count in summary.json)",
    )


def _bootstrap_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="bootstrap seed (default %(default)s)")
    parser.add_argument(
        "--replicates",
        type=_positive,
        default=DEFAULT_REPLICATES,
        help="bootstrap replicates (default %(default)s)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    ev = subparsers.add_parser(
        "eval", help="score a frozen probe or a public benchmark: artifacts + summary.json with bootstrap"
    )
    ev.add_argument("--model", required=True, help="rewardplane checkpoint or Hugging Face model directory")
    ev.add_argument("--probe", help="probe.json written by rewardplane data freeze-probe")
    ev.add_argument(
        "--benchmark",
        choices=("rewardbench", "rewardbench2", "rm-bench"),
        help="evaluate a local copy of a public benchmark (--data: parquet, json, jsonl or a datasets folder)",
    )
    ev.add_argument(
        "--data", required=True, help="evaluation pairs the probe was frozen from, or the benchmark data"
    )
    ev.add_argument("--out", required=True, help="output directory")
    ev.add_argument(
        "--batch-size",
        type=_positive,
        default=16,
        help="DPO policies and encoder reward models: pairs per forward batch (default %(default)s)",
    )
    ev.add_argument(
        "--max-batch-tokens",
        type=_positive,
        help="decoder reward models: tokens per forward, packed or padded (default 65536)",
    )
    ev.add_argument(
        "--dtype",
        choices=("fp32", "bf16", "fp16"),  # core.config.DTYPES (importing it would load pydantic)
        default="fp32",
        help="reward models: fp32 (default), bf16 or fp16; on CUDA bf16/fp16 score padding-free",
    )
    ev.add_argument(
        "--reference", help="DPO only: the reference model directory, checked against the sidecar"
    )
    ev.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    ev.add_argument(
        "--max-length",
        type=_positive,
        default=4096,
        help="--benchmark: tokens per scored text; longer ones are cut from the left (default %(default)s)",
    )
    ev.add_argument(
        "--truncation",
        choices=("truncate", "drop"),
        default="truncate",
        help="--benchmark: cut over-long texts from the left, or reject their examples as oversize",
    )
    ev.add_argument(
        "--progress-every",
        type=_positive_seconds,
        default=DEFAULT_EVERY_S,
        metavar="SECONDS",
        help="scoring progress on stderr: a live bar on a terminal, otherwise one line this often"
        " (default %(default)s)",
    )
    ev.add_argument("--no-progress", action="store_true", help="no scoring progress on stderr")
    _strict_overlap_option(ev)
    _bootstrap_options(ev)
    add_overwrite_option(ev, "what is in a non-empty --out folder")
    ev.set_defaults(func=_eval)

    cmp_parser = subparsers.add_parser(
        "compare", help="paired bootstrap + exact McNemar of B vs A on one probe"
    )
    cmp_parser.add_argument("a", help="A/pairs.jsonl or A/examples.jsonl of a benchmark (baseline)")
    cmp_parser.add_argument("b", help="B/pairs.jsonl or B/examples.jsonl (candidate)")
    cmp_parser.add_argument("--out", required=True, help="directory for comparison.json")
    _strict_overlap_option(cmp_parser)
    _bootstrap_options(cmp_parser)
    add_overwrite_option(cmp_parser, "what is in a non-empty --out folder")
    cmp_parser.set_defaults(func=_compare)

    rep = subparsers.add_parser("report", help="HTML + Markdown report of a run or an eval directory")
    rep.add_argument("run_dir", help="run directory (metrics.jsonl, eval/step-*/, config.yaml)")
    rep.add_argument("--out", help="output directory (default RUN_DIR/report)")
    add_overwrite_option(rep, "what is in a non-empty output folder (a previous report included)")
    rep.set_defaults(func=_report)
