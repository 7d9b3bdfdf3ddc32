"""`rewardplane train rm --config cfg.yaml [key=value ...]` (also under `torchrun`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    train = subparsers.add_parser("train", help="train reward models (and, with their recipes, policies)")
    commands = train.add_subparsers(dest="train_command", metavar="<objective>")
    objectives = (
        ("rm", "train a Bradley–Terry reward model", "docs/training.md", _train_rm),
        ("dpo", "train a causal-LM policy with DPO against a frozen reference", "docs/dpo.md", _train_dpo),
    )
    for name, summary, docs, handler in objectives:
        parser = commands.add_parser(
            name, help=summary, description=f"{summary[0].upper()}{summary[1:]}. Config keys: {docs}."
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
        parser.set_defaults(func=handler, objective=name)
    train.set_defaults(func=lambda _args: (train.print_help(), 2)[1])


def _train_rm(args: argparse.Namespace) -> int:
    from rewardplane.train.config import load_config
    from rewardplane.train.recipes.reward_model import run

    return _train(args, load_config, run)


def _train_dpo(args: argparse.Namespace) -> int:
    from rewardplane.train.config import load_dpo_config
    from rewardplane.train.recipes.dpo import run

    return _train(args, load_dpo_config, run)


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


def _train(args: argparse.Namespace, load, run) -> int:
    from rewardplane.core.errors import RewardplaneError, UsageError
    from rewardplane.train.resume import TrainingInterrupted, interrupt_report

    if args.debug:
        os.environ["REWARDPLANE_DEBUG"] = "1"
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = load(args.config, args.overrides)
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
