"""Shared pytest setup: the `gpu` marker skips without CUDA; tests stay single-threaded and offline."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# tests/support (builders, fakes, subprocess workers) is imported as `support`; test modules never
# import each other (tests/test_layering.py checks it).
sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a hard dependency
        has_cuda = False
    if has_cuda:
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA (gpu marker)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # not `in item.keywords`: a folder named gpu
            item.add_marker(skip_gpu)


@pytest.fixture
def ray_env(monkeypatch):
    """A private temp dir for a local Ray (tests/deploy): Ray puts Unix sockets under it, so it
    is short; replicas get this process's sys.path (they import `support.deploy_fakes`)."""
    temp = tempfile.mkdtemp(prefix="rkray-", dir="/tmp")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    yield temp
    shutil.rmtree(temp, ignore_errors=True)
