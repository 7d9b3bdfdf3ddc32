"""Pieces every model scorer shares: dtype names, devices, weight hashing, text flattening."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from rewardplane.core.config import FieldError
from rewardplane.core.hashing import sha256_file, sha256_json
from rewardplane.serve.scorers.base import Scorer

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def torch_dtype(name: str):
    """`models.loading.torch_dtype`, imported on first use: the serve frontend never loads torch."""
    from rewardplane.models.loading import torch_dtype as resolve

    return resolve(name)


def weights_digest(path: str | Path) -> str:
    """SHA-256 over every weight file (name + content hash), so an identity changes with the weights."""
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"no weight files ({', '.join(WEIGHT_SUFFIXES)}) under {root}")
    return sha256_json({str(p.relative_to(root)): sha256_file(p) for p in files})


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


def resolve_device(device: str) -> str:
    """`auto` means the first GPU when there is one: a service never silently picks CPU on a GPU box."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class ModelScorer(Scorer):
    """A scorer backed by model weights: from a local directory (`path`) or a named shape."""

    shapes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, name: str, options: Any = None, *, device: str = "cpu", **kwargs: Any) -> None:
        super().__init__(name, options, device=resolve_device(device), **kwargs)
        self.model = self.tokenizer = None

    @classmethod
    def check_spec(cls, spec: Any) -> None:
        if spec.path is None and spec.shape is None:
            raise FieldError("path", f"kind {cls.kind} needs path (a local model directory) or shape")
        if spec.shape is not None and spec.shape not in cls.shapes:
            raise FieldError("shape", f"unknown shape {spec.shape!r}; known: {sorted(cls.shapes)}")

    def placement(self) -> tuple[str, str]:
        return self.dtype, self.device

    def identity_config(self) -> dict[str, Any]:
        return json_config(self.model.config)

    def info_extra(self) -> dict[str, Any]:
        return {"path": self.path, "shape": self.shape}
