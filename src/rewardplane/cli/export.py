"""`rewardplane export hf CKPT OUT`: a rewardplane checkpoint as a standard Hugging Face model."""

from __future__ import annotations

import argparse
import json

from rewardplane.core.errors import RewardplaneError, UsageError
from rewardplane.core.outputs import add_overwrite_option, check_out_dir


def register(subparsers: argparse._SubParsersAction) -> None:
    export = subparsers.add_parser("export", help="export checkpoints to other formats")
    formats = export.add_subparsers(dest="export_format", metavar="<format>")
    hf = formats.add_parser("hf", help="write a standard Hugging Face model directory")
    hf.add_argument("checkpoint", help="rewardplane checkpoint directory (RUN/checkpoints/step-NNNNNNN)")
    hf.add_argument("out", help="output directory (absent or empty)")
    add_overwrite_option(hf, "a non-empty output folder, everything in it included")
    hf.set_defaults(func=_export_hf_command)
    export.set_defaults(func=lambda _args: (export.print_help(), 2)[1])


def _export_hf_command(args: argparse.Namespace) -> int:
    check_out_dir(args.out, overwrite=args.overwrite, option="OUT")
    from transformers.utils import logging as hf_logging

    from rewardplane.objectives.registry import export_hf

    hf_logging.disable_progress_bar()  # "Loading weights" / "Writing model shards" bars: the JSON line says it
    try:
        report = export_hf(args.checkpoint, args.out, overwrite=True)
    except UsageError:
        raise
    except RewardplaneError as exc:
        raise UsageError(f"[{exc.code}] {exc.message}", code=exc.code) from exc
    print(json.dumps(report))
    return 0
