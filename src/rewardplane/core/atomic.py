"""Atomic writes: write to a temporary sibling, fsync, rename.

A crash at any point leaves either the old content or the new content, never a torn file.
Directories (checkpoints) are staged the same way and renamed into place as a whole.

`tempfile` creates its files 0600 and its folders 0700 whatever the umask; renamed into place
they would stay private, and a teammate on a shared cluster could not read a checkpoint or a
report. So each staged file or folder is given the mode `open()` / `mkdir()` would have given
it (0666 / 0777 less the process's umask) before it is renamed — in a staged directory every
file, since libraries writing into it do the same (safetensors' `save_file` creates 0600).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def fsync_dir(path: str | Path) -> None:
    """Flush a directory entry so a rename inside it survives power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def current_umask() -> int:
    """The process's umask, read without changing it where Linux reports it (`os.umask` can only
    be read by setting it, which would briefly give files created by other threads mode 0666)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """What `open(path, "w")` creates: 0666 less the umask."""
    return 0o666 & ~current_umask()


def dir_mode() -> int:
    """What `mkdir` creates: 0777 less the umask."""
    return 0o777 & ~current_umask()


def write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), file_mode())  # mkstemp's 0600 would outlive the rename
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def write_text(path: str | Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj: Any, *, indent: int | None = 2) -> None:
    write_text(path, json.dumps(obj, indent=indent, sort_keys=True, allow_nan=False) + "\n")


def fsync_tree(root: str | Path, *, umask_modes: bool = False) -> None:
    """fsync every file and directory below root (before renaming it into place); `umask_modes`
    also gives each the mode the umask asks for (0666 / 0777 less it)."""
    files, dirs = file_mode(), dir_mode()
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                if umask_modes:
                    os.fchmod(fd, files)
                os.fsync(fd)
            finally:
                os.close(fd)
        if umask_modes:
            os.chmod(dirpath, dirs)
        fsync_dir(dirpath)


@contextlib.contextmanager
def staged_dir(final: str | Path) -> Iterator[Path]:
    """Yield a temporary directory that becomes `final` only if the block succeeds.

    An existing `final` is replaced only after the new one is complete and synced.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        yield tmp
        fsync_tree(tmp, umask_modes=True)  # mkdtemp's 0700 and a library's 0600 would outlive the rename
        if final.exists():
            trash = final.with_name(f".{final.name}.old")
            shutil.rmtree(trash, ignore_errors=True)
            os.replace(final, trash)
            os.replace(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
