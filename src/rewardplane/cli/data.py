"""`rewardplane data validate|prepare|freeze-probe|synth`.

Exit codes (a stable interface): 0 success (validate: every row valid), 1 validate found
rejected rows (the report is still written), 2 usage or I/O error (one line, no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rewardplane.core.errors import UsageError
from rewardplane.core.outputs import add_overwrite_option, check_out_dir, check_out_file


def register(subparsers) -> None:
    data = subparsers.add_parser("data", help="validate, split, freeze-probe and synthesise preference data")
    commands = data.add_subparsers(dest="data_command", metavar="<command>")
    data.set_defaults(func=lambda args: _help(data))

    validate = commands.add_parser("validate", help="check every row; print a summary; write rejections")
    validate.add_argument("input", metavar="IN", help="file, Hub-format folder, or FOLDER:SPLIT")
    _tokenizer_args(validate)
    validate.add_argument("--report", metavar="REJECTS.jsonl", help="write one JSON line per rejected row")
    add_overwrite_option(validate, "an existing --report file")
    validate.set_defaults(func=cmd_validate)

    prepare = commands.add_parser("prepare", help="split valid rows into train/eval with a manifest")
    prepare.add_argument("input", metavar="IN")
    prepare.add_argument("--out", required=True, metavar="DIR")
    prepare.add_argument("--eval-size", required=True, type=int, metavar="N")
    prepare.add_argument("--seed-key", required=True, metavar="KEY")
    prepare.add_argument(
        "--split-by",
        choices=("pair", "prompt", "first_turn"),
        default="pair",
        help="keep each group on one side of the split: a pair alone (default), every pair of one prompt,"
        " or every pair whose conversation opens with the same user turn",
    )
    _tokenizer_args(prepare)
    add_overwrite_option(prepare, "a non-empty --out folder, everything in it included")
    prepare.set_defaults(func=cmd_prepare)

    probe = commands.add_parser(
        "freeze-probe",
        help="freeze the probe contract of an eval set",
        description="Freeze the probe contract of an eval set. Given a folder written by `rewardplane data"
        " prepare` (or its eval.jsonl), the tokenizer and settings it was prepared with apply; options"
        " given here override them.",
    )
    probe.add_argument("input", metavar="EVAL.jsonl|PREPARED_DIR")
    _tokenizer_args(probe)
    probe.add_argument("--out", required=True, metavar="probe.json")
    add_overwrite_option(probe, "an existing --out file")
    probe.set_defaults(func=cmd_freeze_probe)

    synth = commands.add_parser("synth", help="write the built-in synthetic preference task")
    synth.add_argument("--out", required=True, metavar="FILE", help=".jsonl or .json")
    synth.add_argument("--n", required=True, type=int, metavar="N")
    synth.add_argument("--seed", type=int, default=0, metavar="S")
    synth.add_argument(
        "--corrupt", type=int, default=0, metavar="K", help="append K bad rows per reason code"
    )
    add_overwrite_option(synth, "an existing --out file")
    synth.set_defaults(func=cmd_synth)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _tokenizer_args(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    parser.add_argument(
        "--tokenizer", required=required, metavar="DIR", help="local tokenizer directory, or 'builtin'"
    )
    parser.add_argument("--max-length", type=int, metavar="N", help="default 1024")
    parser.add_argument("--max-completion-length", type=int, metavar="N", help="default 512")
    parser.add_argument("--truncation", choices=("drop", "truncate"), help="default drop")
    parser.add_argument(
        "--plain-text",
        choices=("text_eos", "chat_template"),
        help="plain-string rows: the text + EOS as TRL (default text_eos), or through the chat"
        " template (checkpoints trained before rewardplane followed TRL here)",
    )


def _given_settings(args: argparse.Namespace) -> dict:
    return {
        key: value
        for key, value in (
            ("max_length", args.max_length),
            ("max_completion_length", args.max_completion_length),
            ("truncation", args.truncation),
            ("plain_text", args.plain_text),
        )
        if value is not None
    }


def _tokenizer_and_settings(args: argparse.Namespace):
    from rewardplane.data.tokenize import TokenizeSettings, load_tokenizer

    given = _given_settings(args)
    if args.tokenizer is None:
        if given:
            raise UsageError(
                "--max-length/--max-completion-length/--truncation/--plain-text need --tokenizer"
            )
        return None, TokenizeSettings()
    return load_tokenizer(args.tokenizer), TokenizeSettings(**given)


def _input(path: str) -> str:
    """A file, a Hub-format folder, or `FOLDER:SPLIT` (rewardplane.data.reader.resolve_source)."""
    from rewardplane.data.reader import resolve_source

    if not resolve_source(path)[0].exists():
        raise UsageError(f"{path}: no such file or folder")
    return path


def _progress(desc: str):
    from tqdm import tqdm

    return tqdm(desc=desc, unit=" rows", file=sys.stderr, disable=None, mininterval=0.5)


def cmd_validate(args: argparse.Namespace) -> int:
    from rewardplane.core.atomic import write_bytes
    from rewardplane.core.hashing import canonical_json
    from rewardplane.data.pipeline import Summary, iter_validated
    from rewardplane.data.reader import UnterminatedInput
    from rewardplane.data.reasons import Rejection

    source = _input(args.input)
    if args.report:
        check_out_file(args.report, overwrite=args.overwrite, option="--report")
    tokenizer, settings = _tokenizer_and_settings(args)
    summary = Summary()
    report: list[bytes] = []  # rejections only; written atomically once the pass is complete
    unterminated = None
    with _progress("validate") as bar:
        try:
            for item in iter_validated(source, tokenizer, settings):
                summary.add(item)
                bar.update(1)
                if args.report and isinstance(item, Rejection):
                    report.append(canonical_json(item.to_json()) + b"\n")
        except UnterminatedInput as exc:  # the complete elements before the cut were checked
            unterminated = exc
    if args.report:
        write_bytes(args.report, b"".join(report))
    print(summary.table())
    if args.report:
        print(f"rejections written to {args.report}")
    if unterminated is not None:
        raise unterminated
    return 1 if summary.rejected else 0


def cmd_prepare(args: argparse.Namespace) -> int:
    from rewardplane.data.manifest import prepare

    source = _input(args.input)
    check_out_dir(args.out, overwrite=args.overwrite)
    tokenizer, settings = _tokenizer_and_settings(args)
    name = None if args.tokenizer is None else Path(args.tokenizer).name
    with _progress("prepare") as bar:
        manifest = prepare(
            source,
            args.out,
            eval_size=args.eval_size,
            seed_key=args.seed_key,
            tokenizer=tokenizer,
            tokenizer_name=name,
            settings=settings,
            progress=bar,
            split_by=args.split_by,
        )
    counts = manifest["counts"]
    print(
        f"{counts['rows']} rows: {counts['train']} train, {counts['eval']} eval, "
        f"{counts['rejected']} rejected -> {args.out}"
    )
    return 0


def _prepared_tokenizer_and_settings(args: argparse.Namespace, folder: Path, recorded: dict | None):
    """The tokenizer and settings a prepared folder recorded, each overridden by an option given."""
    from rewardplane.data.tokenize import BUILTIN, TokenizeSettings, load_tokenizer, recorded_settings

    if recorded is None:
        if args.tokenizer is None:
            raise UsageError(f"{folder} was prepared without --tokenizer: give --tokenizer")
        return _tokenizer_and_settings(args)
    spec = args.tokenizer
    if spec is None:
        if recorded.get("name") != BUILTIN:
            raise UsageError(
                f"{folder} was prepared with the tokenizer directory {recorded.get('name')!r}: give its path"
                " as --tokenizer"
            )
        spec = BUILTIN
    return load_tokenizer(spec), TokenizeSettings(
        **{**recorded_settings(recorded["settings"]), **_given_settings(args)}
    )


def cmd_freeze_probe(args: argparse.Namespace) -> int:
    from rewardplane.core.atomic import write_json
    from rewardplane.data.manifest import prepared_eval
    from rewardplane.data.probe import freeze_probe_file

    check_out_file(args.out, overwrite=args.overwrite)
    prepared = prepared_eval(args.input)
    if prepared is None:
        _input(args.input)
        if args.tokenizer is None:
            raise UsageError(
                "--tokenizer is required (or give a folder written by `rewardplane data prepare --tokenizer ...`)"
            )
        source, origin = args.input, ""
        tokenizer, settings = _tokenizer_and_settings(args)
    else:
        source, manifest = prepared
        manifest_path = source.parent / "manifest.json"
        tokenizer, settings = _prepared_tokenizer_and_settings(args, source.parent, manifest.get("tokenizer"))
        origin = f" from {manifest_path}" if manifest.get("tokenizer") else ""
    probe = freeze_probe_file(source, tokenizer, settings)
    write_json(args.out, probe)
    print(
        f"probe: {probe['count']} pairs of {source} (max_length {settings.max_length}, max_completion_length "
        f"{settings.max_completion_length}{origin}): contract_sha256 {probe['contract_sha256'][:16]}, "
        f"tokens_sha256 {probe['tokens_sha256'][:16]} -> {args.out}"
    )
    return 0


def cmd_synth(args: argparse.Namespace) -> int:
    from rewardplane.core.atomic import write_text
    from rewardplane.data.synth import corrupt_rows, generate_rows

    if args.n < 0 or args.corrupt < 0:
        raise UsageError("--n and --corrupt must be >= 0")
    out = check_out_file(args.out, overwrite=args.overwrite)
    rows = generate_rows(args.n, args.seed) + [row for _, row in corrupt_rows(args.corrupt, args.seed)]
    if out.suffix == ".json":
        write_text(out, json.dumps(rows, ensure_ascii=False, indent=1) + "\n")
    elif out.suffix == ".jsonl":  # corrupt rows may hold NaN/inf margins: plain json.dumps writes them
        write_text(out, "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in rows))
    else:
        raise UsageError(f"--out must end in .jsonl or .json, got {out.name!r}")
    print(f"wrote {len(rows)} rows ({args.n} task rows, {len(rows) - args.n} validation-demo rows) -> {out}")
    return 0
