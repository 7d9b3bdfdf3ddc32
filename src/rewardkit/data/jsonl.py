"""Write JSON Lines atomically while streaming: rows go to a temporary sibling that is
fsynced and renamed into place only when the writer closes without error."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rewardkit.atomic import fsync_dir
from rewardkit.hashing import canonical_json


class JsonlWriter:
    def __init__(self, handle) -> None:
        self._handle = handle
        self.rows = 0

    def write(self, obj: Any) -> None:
        """One canonical JSON line (sorted keys, compact, UTF-8, no NaN)."""
        self._handle.write(canonical_json(obj) + b"\n")
        self.rows += 1

    def write_line(self, line: bytes) -> None:
        self._handle.write(line)
        self.rows += 1


@contextlib.contextmanager
def atomic_jsonl(path: str | Path) -> Iterator[JsonlWriter]:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb", buffering=1 << 20) as handle:
            yield JsonlWriter(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
