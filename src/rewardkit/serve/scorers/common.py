"""Pieces every model scorer shares: dtype names, weight hashing, identity, text flattening."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rewardkit import __version__
from rewardkit.hashing import sha256_file, sha256_json

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def torch_dtype(name: str):
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def weights_digest(path: str | Path) -> str:
    """SHA-256 over every weight file (name + content hash), so an identity changes with the weights."""
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"no weight files ({', '.join(WEIGHT_SUFFIXES)}) under {root}")
    return sha256_json({str(p.relative_to(root)): sha256_file(p) for p in files})


def identity(*, kind: str, weights: str, config: dict[str, Any], dtype: str, options: dict[str, Any]) -> str:
    """Stable id a client can pin: same weights + model config + dtype + scoring options -> same hash."""
    return sha256_json(
        {"kind": kind, "weights": weights, "config": config, "dtype": dtype, "options": options}
    )


def json_config(config: Any) -> dict[str, Any]:
    """A model config as plain JSON for hashing (drops keys that vary by library version only)."""
    raw = config.to_dict()
    for key in (
        "transformers_version",
        "_name_or_path",
        "torch_dtype",
        "dtype",
        "architectures",
        "_attn_implementation_autoset",
    ):
        raw.pop(key, None)
    import json

    return json.loads(json.dumps(raw, default=str))


def as_messages(value: str | list[dict[str, str]], role: str) -> list[dict[str, str]]:
    return [{"role": role, "content": value}] if isinstance(value, str) else list(value)


def as_text(value: str | list[dict[str, str]]) -> str:
    return value if isinstance(value, str) else "\n".join(m.get("content", "") for m in value)


VERSION = __version__
