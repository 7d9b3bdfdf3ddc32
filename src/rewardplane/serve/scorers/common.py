"""Pieces every model scorer shares: dtype names, weight hashing, identity, text flattening."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from rewardplane import __version__
from rewardplane.core.errors import ConfigError
from rewardplane.core.hashing import sha256_file, sha256_json
from rewardplane.serve.protocol import ScorerInfo
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


def check_options(
    name: str, kind: str, options: dict[str, Any] | None, allowed: frozenset[str]
) -> dict[str, Any]:
    """A copy of `options`; an unknown key is a ConfigError (a typo must not become a default)."""
    options = dict(options or {})
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ConfigError(f"scorer {name!r} ({kind}): unknown options {unknown}; known: {sorted(allowed)}")
    return options


class OptionsScorer(Scorer):
    """A scorer configured by its `options` alone (rules, verifiers, judges, composites): the
    options are checked against `allowed_options` and `from_spec` passes them on."""

    allowed_options: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self,
        name: str,
        *,
        options: dict[str, Any] | None = None,
        max_batch_size: int = 64,
        max_wait_ms: float = 5.0,
    ) -> None:
        super().__init__(name, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms)
        self.options = check_options(name, self.kind, options, self.allowed_options)

    @classmethod
    def from_spec(cls, spec: Any) -> Scorer:
        return cls(
            spec.name, options=spec.options, max_batch_size=spec.max_batch_size, max_wait_ms=spec.max_wait_ms
        )


class ModelScorer(Scorer):
    """A scorer backed by model weights: from a local directory (`path`) or a named shape."""

    allowed_options: ClassVar[frozenset[str]] = frozenset()
    shapes: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        name: str,
        *,
        path: str | None = None,
        shape: str | None = None,
        dtype: str = "fp32",
        device: str = "cpu",
        options: dict[str, Any] | None = None,
        max_batch_size: int = 32,
        max_wait_ms: float = 5.0,
    ) -> None:
        super().__init__(name, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms)
        self.options = check_options(name, self.kind, options, self.allowed_options)
        if (path is None) == (shape is None):
            raise ConfigError(f"scorer {name!r} ({self.kind}): give exactly one of path or shape")
        if shape is not None and shape not in self.shapes:
            raise ConfigError(f"scorer {name!r}: unknown shape {shape!r}; known: {sorted(self.shapes)}")
        self.path, self.shape, self.dtype, self.device = path, shape, dtype, device
        self.model = self.tokenizer = None
        self._weights = ""

    @classmethod
    def from_spec(cls, spec: Any) -> Scorer:
        return cls(
            spec.name,
            path=spec.path,
            shape=spec.shape,
            dtype=spec.dtype,
            device=spec.resolved_device(),
            options=spec.options,
            max_batch_size=spec.max_batch_size,
            max_wait_ms=spec.max_wait_ms,
        )

    def identity_options(self) -> dict[str, Any]:
        """The options that change scores (and so the identity); trust_remote_code does not."""
        return {k: v for k, v in self.options.items() if k != "trust_remote_code"}

    def info_extra(self) -> dict[str, Any]:
        return {}

    def info(self) -> ScorerInfo:
        return ScorerInfo(
            name=self.name,
            kind=self.kind,
            modality=self.modality,
            dtype=self.dtype,
            device=self.device,
            version=VERSION,
            identity=identity(
                kind=self.kind,
                weights=self._weights,
                config=json_config(self.model.config),
                dtype=self.dtype,
                options=self.identity_options(),
            ),
            max_batch_size=self.max_batch_size,
            max_wait_ms=self.max_wait_ms,
            extra={"path": self.path, "shape": self.shape, **self.info_extra()},
        )
