"""What a command may write over: nothing it did not write in that run, unless told `--overwrite`.

Every command that writes a folder or a file at a path the user names checks it here before any
work starts (and before torch is imported): a non-empty folder or an existing file is refused in
one line that lists what is there, so re-running `data prepare --out data/` cannot silently
delete the probe the tour froze into `data/`. `--overwrite` is the user's consent.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rewardplane.core.errors import UsageError

SHOWN = 6  # names listed in the refusal; the rest are counted


def add_overwrite_option(parser: argparse.ArgumentParser, what: str) -> None:
    """`--overwrite`, worded for what the command replaces (`what`)."""
    parser.add_argument(
        "--overwrite", action="store_true", help=f"replace {what} (default: refuse when it is there)"
    )


def _listing(folder: Path) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
    more = f", ... ({len(names) - SHOWN} more)" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def check_out_dir(path: str | Path, *, overwrite: bool, option: str = "--out") -> Path:
    """`path` as a Path when it is absent or an empty folder (or `overwrite`); else a UsageError."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path} is a file, not a folder: choose a folder")
    if overwrite or not path.is_dir() or not any(path.iterdir()):
        return path
    raise UsageError(
        f"{option} {path} is not empty ({_listing(path)}): pass --overwrite to replace what is there,"
        " or choose another folder",
        code="output_exists",
    )


def check_out_file(path: str | Path, *, overwrite: bool, option: str = "--out") -> Path:
    """`path` as a Path when nothing is there (or `overwrite` and it is a file); else a UsageError."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{option} {path} is a folder: give a file path")
    if path.exists() and not overwrite:
        raise UsageError(
            f"{option} {path} already exists: pass --overwrite to replace it, or choose another path",
            code="output_exists",
        )
    return path
