"""`rewardplane train <objective> --config cfg.yaml [key=value ...]` (also under `torchrun`).

One subcommand per row of the objective registry (`rewardplane.objectives.registry`, a light
import: the rows name their modules, which load only when a command runs)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    train = subparsers.add_parser("train", help="train reward models (and, with their recipes, policies)")
    from rewardplane.objectives.registry import OBJECTIVES

    commands = train.add_subparsers(dest="train_command", metavar="<objective>")
    for spec in OBJECTIVES.values():
        summary = spec.summary
        parser = commands.add_parser(
            spec.command,
            help=summary,
            description=f"{summary[0].upper()}{summary[1:]}. Config keys: {spec.docs}.",
        )
        parser.add_argument("--config", help="YAML config file (defaults apply to keys it leaves out)")
        parser.add_argument(
            "overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. optim.lr=1e-4"
        )
        parser.add_argument(
            "--resume", metavar="CKPT|auto", help="checkpoint directory, or 'auto' for the run's latest"
        )
        parser.add_argument(
            "--allow-new-data", action="store_true", help="resume although the data manifest changed"
        )
        parser.add_argument(
            "--overwrite",
            action="store_true",
            help="delete a non-empty run directory and start again (a fresh run into one is refused)",
        )
        parser.add_argument("--debug", action="store_true", help="show the traceback behind a one-line error")
        parser.set_defaults(func=_train, objective=spec.command, objective_name=spec.name)
    train.set_defaults(func=lambda _args: (train.print_help(), 2)[1])


def resume_command(args: argparse.Namespace) -> str:
    """The command that continues this run: the same one, with `--resume auto` (under torchrun,
    through torchrun with the same number of processes)."""
    words = ["rewardplane", "train", args.objective]
    if args.config:
        words += ["--config", args.config]
    words += [*args.overrides, "--resume", "auto"]
    if args.allow_new_data:
        words.append("--allow-new-data")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        words = ["torchrun", "--nproc-per-node", str(world), "-m", "rewardplane", *words[1:]]
    return shlex.join(words)


def _train(args: argparse.Namespace) -> int:
    from rewardplane.core.errors import RewardplaneError, UsageError
    from rewardplane.train.config import load_objective_config

    if args.debug:
        os.environ["REWARDPLANE_DEBUG"] = "1"
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = load_objective_config(args.objective_name, args.config, args.overrides)  # before torch
    from rewardplane.train.recipe import run
    from rewardplane.train.resume import TrainingInterrupted, interrupt_report

    try:
        result = run(cfg, resume=args.resume, allow_new_data=args.allow_new_data, overwrite=args.overwrite)
    except TrainingInterrupted as exc:
        if int(os.environ.get("RANK", "0")) == 0:
            print(interrupt_report(exc, resume_command(args)), file=sys.stderr)
        return 130
    except UsageError:
        raise
    except RewardplaneError as exc:
        raise UsageError(f"[{exc.code}] {exc.message}", code=exc.code) from exc
    if result.checkpoint is not None:
        report = {"run_dir": str(result.run_dir), "step": result.step, "checkpoint": str(result.checkpoint)}
        report["final_accuracy"] = result.final_accuracy
        print(json.dumps(report), file=sys.stdout)
    return 0
