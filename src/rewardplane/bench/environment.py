"""The environment block of a run: what a reader needs to reproduce or distrust a number.

Collected on the load-generating host, which is also the serving host in every setup the
docs describe (the service binds 127.0.0.1 by default). The deployment mode and MPS state
come from the service itself (`GET /v1/deployment`) when it offers that endpoint.
"""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import rewardplane


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_sha() -> dict[str, Any]:
    """Commit of the rewardplane source tree in use (None for an installed wheel)."""
    root = Path(rewardplane.__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if sha.returncode != 0:
            return {"git_sha": None, "git_dirty": None}
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "."],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return {"git_sha": sha.stdout.strip(), "git_dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"git_sha": None, "git_dirty": None}


def _torch_cuda() -> str | None:
    """The CUDA version torch was built against; importing torch here costs seconds, once."""
    try:
        import torch
    except ImportError:
        return None
    return torch.version.cuda


def collect_environment(gpu_info: dict[str, Any], deployment: dict[str, Any] | None) -> dict[str, Any]:
    deployment = deployment or {}
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": _version("torch"),
        "torch_cuda": _torch_cuda(),
        "transformers": _version("transformers"),
        "rewardplane": rewardplane.__version__,
        **_git_sha(),
        "gpu": gpu_info,
        "deployment_mode": deployment.get("mode"),
        "mps": deployment.get("mps"),
        "deployment": deployment or None,
    }
