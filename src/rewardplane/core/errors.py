"""Errors that carry a stable, machine-readable code.

Every layer (data validation, checkpoints, the CLI, the HTTP service) raises errors with a
code attached where the failure is detected, so nothing downstream has to recover a reason
by matching message text.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class RewardplaneError(Exception):
    """Base class: `code` is stable and documented, `message` is for people."""

    code: str = "error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class UsageError(RewardplaneError):
    """Bad arguments, config or input files: the CLI prints one line and exits 2."""

    code = "usage"


class ConfigError(UsageError):
    """A config file or key=value override that does not validate."""

    code = "config"


@contextlib.contextmanager
def reading(path: object, what: str, *, code: str = "unreadable") -> Iterator[None]:
    """Turn a library's failure to read a local `path` (transformers, safetensors, tokenizers: an
    empty folder, a missing config.json, a file of another kind) into one `UsageError` line naming
    the path and the library's first line. The library's exception stays its cause, for the
    traceback `--debug` (REWARDPLANE_DEBUG) prints."""
    try:
        yield
    except (OSError, ValueError, KeyError, TypeError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise UsageError(
            f"{path}: cannot load the {what} ({type(exc).__name__}: {first})", code=code
        ) from exc
