"""`rewardplane <group> <command>`: the stable command-line interface.

Each feature package contributes its commands through a `register(subparsers)` function so
this file stays a thin dispatcher. Handlers import heavy libraries lazily, which keeps
`rewardplane --help` fast. Usage and input errors print one line and exit 2, never a traceback;
with `--debug` (or REWARDPLANE_DEBUG=1) the traceback behind the line is printed above it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from rewardplane import __version__
from rewardplane.core.errors import UsageError

COMMAND_MODULES: list[str] = [
    # one line per feature package; each module defines register(subparsers)
    "rewardplane.cli.data",
    "rewardplane.cli.train",
    "rewardplane.cli.export",
    "rewardplane.cli.eval",
    "rewardplane.cli.serve",
    "rewardplane.cli.bench",
]


# argparse destinations that name a local input a command reads: each is checked before the handler
# runs (and so before it imports torch), so a typo is answered at once, whatever the command
INPUT_PATHS: dict[str, str] = {
    "config": "config file",
    "deploy": "deploy file",
    "plan": "plan file",
    "model": "--model",
    "probe": "--probe",
    "reference": "--reference",
    "checkpoint": "checkpoint",
    "inputs": "--inputs",
    "token_file": "--token-file",
}


def check_inputs(args: argparse.Namespace) -> None:
    """One line naming the first input path (`INPUT_PATHS`) that does not exist."""
    from pathlib import Path

    for dest, what in INPUT_PATHS.items():
        value = getattr(args, dest, None)
        if isinstance(value, (str, Path)) and not Path(value).exists():
            raise UsageError(f"{what} {value} does not exist", code="no_such_path")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rewardplane", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"rewardplane {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="<command>")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "func", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        check_inputs(args)
        return int(handler(args) or 0)
    except UsageError as exc:
        if os.environ.get("REWARDPLANE_DEBUG"):
            traceback.print_exception(exc, file=sys.stderr)
        print(f"rewardplane: error: {exc.message}", file=sys.stderr)
        return 2
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        print(f"rewardplane: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
