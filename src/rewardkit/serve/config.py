"""Service configuration: which scorers to host and the request limits, loaded from YAML.

```yaml
token: null            # or set REWARDKIT_TOKEN
limits: {max_body_bytes: 33554432, max_items: 1024, max_image_pixels: 16777216}
scorers:
  - {name: clip, kind: clip, shape: clip-vit-l-14, dtype: fp16, max_batch_size: 64}
  - {name: rm, kind: rm, path: demo-run/model}
```

Every key is checked: an unknown key, a wrong type or an unknown scorer kind is a
`ConfigError` naming the offending key, so a typo never silently falls back to a default.
Scorer kinds come from a registry: the built-ins plus the `rewardkit.scorers` entry-point group.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from rewardkit.core.errors import ConfigError
from rewardkit.serve.scorers.base import Scorer

DTYPES = ("fp32", "fp16", "bf16")

BUILTIN_SCORERS: dict[str, str] = {
    "rm": "rewardkit.serve.scorers.text:RewardModelScorer",
    "hf_seqcls": "rewardkit.serve.scorers.text:SeqClsScorer",
    "clip": "rewardkit.serve.scorers.clip:ClipScorer",
    "pickscore": "rewardkit.serve.scorers.clip:PickScoreScorer",
    "exact_match": "rewardkit.serve.scorers.rules:ExactMatchScorer",
    "regex": "rewardkit.serve.scorers.rules:RegexScorer",
    "length": "rewardkit.serve.scorers.rules:LengthScorer",
}

_REGISTERED: dict[str, type[Scorer]] = {}


@dataclass(frozen=True)
class ScorerSpec:
    """One hosted scorer. Exactly one of `path` (a local model directory) or `shape` (a named
    random-initialised shape for tests and benchmarks) is needed by model kinds; rules need neither."""

    name: str
    kind: str
    path: str | None = None
    shape: str | None = None
    dtype: str = "fp32"
    device: str = "auto"
    max_batch_size: int = 32
    max_wait_ms: float = 5.0
    max_queue: int = 4096
    token_budget: int | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"scorer {self.name!r}"
        if not self.name or not isinstance(self.name, str) or "/" in self.name:
            raise ConfigError(f"{where}: name must be a non-empty string without '/'")
        if self.dtype not in DTYPES:
            raise ConfigError(f"{where}: dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.path is not None and self.shape is not None:
            raise ConfigError(f"{where}: give path or shape, not both")
        for key in ("max_batch_size", "max_queue"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise ConfigError(f"{where}: {key} must be a positive integer")
        if self.token_budget is not None and (
            not isinstance(self.token_budget, int) or self.token_budget < 1
        ):
            raise ConfigError(f"{where}: token_budget must be a positive integer or null")
        if not isinstance(self.max_wait_ms, int | float) or self.max_wait_ms < 0:
            raise ConfigError(f"{where}: max_wait_ms must be a number >= 0")
        if not isinstance(self.options, dict):
            raise ConfigError(f"{where}: options must be a mapping")

    def resolved_device(self) -> str:
        """`auto` means the first GPU when there is one: a service never silently picks CPU on a GPU box."""
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class Limits:
    """Request limits with safe defaults; exceeding one is a 413, never a crash or a slow death."""

    max_body_bytes: int = 32 * 1024 * 1024
    max_items: int = 1024
    max_image_pixels: int = 4096 * 4096
    queue_timeout_s: float = 30.0
    request_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"limits.{f.name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class ServiceConfig:
    scorers: list[ScorerSpec]
    limits: Limits = field(default_factory=Limits)
    token: str | None = None
    prefetch_images: bool = True
    """Decode a request's images when it arrives (thread pool, off the event loop, once for every
    image scorer of the process); false: each batch decodes its own images in one call."""

    def __post_init__(self) -> None:
        if not isinstance(self.prefetch_images, bool):
            raise ConfigError("service config: prefetch_images must be true or false")
        names = [s.name for s in self.scorers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(f"duplicate scorer names: {dupes}")

    def resolved_token(self) -> str | None:
        """The configured token, else `REWARDKIT_TOKEN`; empty means no authentication."""
        return self.token or os.environ.get("REWARDKIT_TOKEN") or None


def _build(cls: type, raw: Any, where: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(raw).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; known: {sorted(known)}")
    try:
        return cls(**raw)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def config_from_dict(raw: Any) -> ServiceConfig:
    if not isinstance(raw, dict):
        raise ConfigError("service config must be a mapping with a 'scorers' list")
    known = {"scorers", "limits", "token", "prefetch_images"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"service config: unknown keys {unknown}; known: {sorted(known)}")
    scorers_raw = raw.get("scorers")
    if not isinstance(scorers_raw, list) or not scorers_raw:
        raise ConfigError("service config: 'scorers' must be a non-empty list")
    scorers = []
    for i, entry in enumerate(scorers_raw):
        spec = _build(ScorerSpec, entry, f"scorers[{i}]")
        if spec.kind not in scorer_registry():
            raise ConfigError(f"scorers[{i}]: unknown kind {spec.kind!r}; known: {sorted(scorer_registry())}")
        scorers.append(spec)
    limits = _build(Limits, raw.get("limits") or {}, "limits")
    token = raw.get("token")
    if token is not None and not isinstance(token, str):
        raise ConfigError("service config: token must be a string")
    prefetch = raw.get("prefetch_images", ServiceConfig.prefetch_images)  # absent: the field's default
    return ServiceConfig(scorers=scorers, limits=limits, token=token, prefetch_images=prefetch)


def load_config(path: str | Path) -> ServiceConfig:
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"service config {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None
    return config_from_dict(raw)


def register_scorer(kind: str, cls: type[Scorer]) -> None:
    """Register a scorer kind in-process (tests, notebooks); packages use the entry-point group."""
    _REGISTERED[kind] = cls


def scorer_registry() -> dict[str, str | type[Scorer]]:
    """kind -> class or "module:attr". Entry points may add kinds but not shadow built-ins."""
    registry: dict[str, str | type[Scorer]] = {}
    for ep in entry_points(group="rewardkit.scorers"):
        registry[ep.name] = ep.value
    registry.update(BUILTIN_SCORERS)
    registry.update(_REGISTERED)
    return registry


def _resolve(target: str | type[Scorer]) -> type[Scorer]:
    if isinstance(target, type):
        return target
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def build_scorer(spec: ScorerSpec) -> Scorer:
    """Construct (not load) the scorer for `spec`; `Scorer.load()` does the heavy work."""
    registry = scorer_registry()
    if spec.kind not in registry:
        raise ConfigError(f"scorer {spec.name!r}: unknown kind {spec.kind!r}; known: {sorted(registry)}")
    cls = _resolve(registry[spec.kind])
    if not (isinstance(cls, type) and issubclass(cls, Scorer)):
        raise ConfigError(f"scorer kind {spec.kind!r} does not resolve to a Scorer subclass")
    return cls.from_spec(spec)
