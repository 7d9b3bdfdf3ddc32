"""Errors that carry a stable, machine-readable code.

Every layer (data validation, checkpoints, the CLI, the HTTP service) raises errors with a
code attached where the failure is detected, so nothing downstream has to recover a reason
by matching message text.
"""

from __future__ import annotations


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
