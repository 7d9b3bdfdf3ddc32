"""Atomic writes give files and folders the modes the umask asks for, as `open` and `mkdir` do."""

from __future__ import annotations

import os
import stat

import pytest

from rewardplane.core import atomic


@pytest.fixture
def umask():
    """Set the process umask for one test and restore it after."""
    previous = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(previous)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize(
    ("mask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750), (0o077, 0o600, 0o700)]
)
def test_atomic_files_and_staged_folders_honour_the_umask(tmp_path, umask, mask, file_mode, dir_mode):
    umask(mask)
    assert atomic.current_umask() == mask
    atomic.write_json(tmp_path / "a" / "summary.json", {"x": 1})
    with atomic.staged_dir(tmp_path / "ckpt") as staged:
        atomic.write_text(staged / "meta.json", "{}")
        (staged / "weights.bin").write_bytes(b"w")  # a library's own open(): the umask applies
        os.close(os.open(staged / "lib.safetensors", os.O_CREAT | os.O_WRONLY, 0o600))  # as safetensors does
        (staged / "sub").mkdir(mode=0o700)
    assert _mode(tmp_path / "a" / "summary.json") == file_mode
    assert _mode(tmp_path / "ckpt") == dir_mode
    assert _mode(tmp_path / "ckpt" / "meta.json") == file_mode
    assert _mode(tmp_path / "ckpt" / "weights.bin") == file_mode
    assert _mode(tmp_path / "ckpt" / "lib.safetensors") == file_mode
    assert _mode(tmp_path / "ckpt" / "sub") == dir_mode
    # and what a plain open()/mkdir() gives, for comparison
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "f").write_text("x")
    assert (_mode(tmp_path / "plain"), _mode(tmp_path / "plain" / "f")) == (dir_mode, file_mode)
