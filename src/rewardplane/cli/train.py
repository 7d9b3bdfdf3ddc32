"""`rewardplane train rm --config cfg.yaml [key=value ...]` (also under `torchrun`)."""

from __future__ import annotations

import argparse
import json
import logging
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
        parser.set_defaults(func=handler)
    train.set_defaults(func=lambda _args: (train.print_help(), 2)[1])


def _train_rm(args: argparse.Namespace) -> int:
    from rewardplane.train.config import load_config
    from rewardplane.train.recipes.reward_model import run

    return _train(args, load_config, run)


def _train_dpo(args: argparse.Namespace) -> int:
    from rewardplane.train.config import load_dpo_config
    from rewardplane.train.recipes.dpo import run

    return _train(args, load_dpo_config, run)


def _train(args: argparse.Namespace, load, run) -> int:
    from rewardplane.core.errors import RewardplaneError, UsageError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = load(args.config, args.overrides)
    try:
        result = run(cfg, resume=args.resume, allow_new_data=args.allow_new_data, overwrite=args.overwrite)
    except UsageError:
        raise
    except RewardplaneError as exc:
        raise UsageError(f"[{exc.code}] {exc.message}", code=exc.code) from exc
    if result.checkpoint is not None:
        report = {"run_dir": str(result.run_dir), "step": result.step, "checkpoint": str(result.checkpoint)}
        report["final_accuracy"] = result.final_accuracy
        print(json.dumps(report), file=sys.stdout)
    return 0
