"""`rewardkit <group> <command>`: the stable command-line interface.

Each feature package contributes its commands through a `register(subparsers)` function so
this file stays a thin dispatcher. Handlers import heavy libraries lazily, which keeps
`rewardkit --help` fast. Usage and input errors print one line and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from rewardkit import __version__
from rewardkit.core.errors import UsageError

COMMAND_MODULES: list[str] = [
    # one line per feature package; each module defines register(subparsers)
    "rewardkit.cli.data",
    "rewardkit.cli.train",
    "rewardkit.cli.export",
    "rewardkit.cli.eval",
    "rewardkit.cli.serve",
    "rewardkit.cli.bench",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rewardkit", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"rewardkit {__version__}")
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
        return int(handler(args) or 0)
    except UsageError as exc:
        print(f"rewardkit: error: {exc.message}", file=sys.stderr)
        return 2
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        print(f"rewardkit: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
