"""Service configuration: which scorers to host and the request limits, loaded from YAML.

```yaml
token: null            # or set REWARDPLANE_TOKEN
limits: {max_body_bytes: 33554432, max_items: 1024, max_image_pixels: 16777216}
scorers:
  - {name: clip, kind: clip, shape: clip-vit-l-14, dtype: fp16, max_batch_size: 64}
  - {name: rm, kind: rm, path: demo-run/model}
```

Every key is checked by the one config loader (`rewardplane.core.config`, docs/config.md): an
unknown key, a wrong type or an unknown scorer kind is a one-line `ConfigError` naming the
dotted key (`scorers[0].max_batch_size`, `scorers[2].options.timeout_s`), so a typo never
silently falls back to a default. Scorer kinds come from a registry: the built-ins plus the
`rewardplane.scorers` entry-point group; each kind's `Scorer.Options` model types its options.
"""

from __future__ import annotations

import importlib
import os
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, SerializeAsAny, ValidationInfo, field_validator, model_validator

from rewardplane.core.config import DTYPES, ConfigModel, Dtype, parse, read_yaml, validate_section
from rewardplane.core.errors import ConfigError
from rewardplane.serve.audit.config import AuditConfig
from rewardplane.serve.scorers.base import Scorer
from rewardplane.serve.scorers.options import ScorerOptions, option_schema

__all__ = [
    "BUILTIN_SCORERS",
    "DTYPES",
    "KindSpec",
    "Limits",
    "ScorerSpec",
    "ServiceConfig",
    "build_scorer",
    "config_from_dict",
    "kind_option_schemas",
    "load_config",
    "register_scorer",
    "scorer_class",
    "scorer_registry",
]

BUILTIN_SCORERS: dict[str, str] = {
    "rm": "rewardplane.serve.scorers.text:RewardModelScorer",
    "hf_seqcls": "rewardplane.serve.scorers.text:SeqClsScorer",
    "clip": "rewardplane.serve.scorers.clip:ClipScorer",
    "pickscore": "rewardplane.serve.scorers.clip:PickScoreScorer",
    "exact_match": "rewardplane.serve.scorers.rules:ExactMatchScorer",
    "regex": "rewardplane.serve.scorers.rules:RegexScorer",
    "length": "rewardplane.serve.scorers.rules:LengthScorer",
    "math": "rewardplane.serve.scorers.math:MathScorer",
    "code": "rewardplane.serve.scorers.code:CodeScorer",
    "composite": "rewardplane.serve.scorers.composite:CompositeScorer",
    "judge": "rewardplane.serve.scorers.judge:JudgeScorer",
}

_REGISTERED: dict[str, type[Scorer]] = {}


class KindSpec(ConfigModel):
    """A scorer kind with its options and model source: what a scorer spec and a composite's
    inline component share. `options` is validated by the kind's own model (`Scorer.Options`),
    read from the registry by `kind`, so its errors name the dotted key
    (`scorers[2].options.timeout_s must be > 0`) like every other key; the kind's rules on
    `path` / `shape` run here too (`Scorer.check_spec`)."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    kind: str
    """The scorer kind (the registry: built-ins and the `rewardplane.scorers` entry points)."""
    options: SerializeAsAny[ScorerOptions] = Field(default_factory=dict, validate_default=True)
    """The kind's options (its table in docs/serve.md)."""
    path: str | None = None
    """Model kinds: a local model directory."""
    shape: str | None = None
    """Model kinds, instead of `path`: a named random-initialised shape (tests, benchmarks)."""
    dtype: Dtype = "fp32"
    """Model kinds: fp32, fp16 or bf16 (or another of the loader's spellings)."""
    device: str = "auto"
    """Model kinds: `auto` (the first GPU when there is one), `cuda:1`, `cpu`, ..."""

    @field_validator("kind")
    @classmethod
    def _registered(cls, kind: str | None) -> str | None:
        if kind is not None:
            scorer_class(kind)  # ValueError: unknown, or not a Scorer
        return kind

    @field_validator("options", mode="before")
    @classmethod
    def _kind_options(cls, value: Any, info: ValidationInfo) -> Any:
        kind = info.data.get("kind")
        if kind is None:  # no kind (a hosted component) or an unknown one, reported on its own
            return ScorerOptions()
        return validate_section(scorer_class(kind).Options, value)

    @model_validator(mode="after")
    def _one_source(self) -> KindSpec:
        if self.path is not None and self.shape is not None:
            raise ValueError("give path or shape, not both")
        if self.kind is not None:
            scorer_class(self.kind).check_spec(self)
        return self

    def resolved_device(self) -> str:
        """`auto` means the first GPU when there is one: a service never silently picks CPU on a GPU box."""
        from rewardplane.serve.scorers.common import resolve_device

        return resolve_device(self.device)


class ScorerSpec(KindSpec):
    """One hosted scorer. Model kinds need exactly one of `path` (a local model directory) or
    `shape` (a named random-initialised shape for tests and benchmarks); rules need neither.

    `dtype` takes any of the loader's spellings (fp16, float16, half, ...) and holds the
    canonical one ("fp32" / "fp16" / "bf16"). Frozen: a spec is the scorer's identity.
    """

    name: str
    max_batch_size: int = Field(32, ge=1)
    max_wait_ms: float = Field(5.0, ge=0)
    max_queue: int = Field(4096, ge=1)
    token_budget: int | None = Field(None, ge=1)
    residency: Literal["resident", "per_call", "on_demand"] = "resident"
    """When the weights are on the GPU (docs/lifecycle.md): `resident` until told to move,
    `per_call` only while requests come, `on_demand` from the first request on."""
    auto_onload: bool | None = None
    """A request that finds the scorer offloaded onloads it (default: only per_call/on_demand)."""
    idle_offload_s: float | None = Field(None, ge=0)
    """per_call / on_demand: offload after this long without a request (per_call default 1 s)."""

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        if not name or "/" in name:
            raise ValueError(f"must be a non-empty string without '/', got {name!r}")
        return name

    @model_validator(mode="after")
    def _lifecycle(self) -> ScorerSpec:
        from rewardplane.serve.lifecycle import policy_of

        try:
            policy_of(self)
        except ConfigError as exc:
            raise ValueError(exc.message) from None
        return self


class Limits(ConfigModel):
    """Request limits with safe defaults; exceeding one is a 413, never a crash or a slow death."""

    model_config = ConfigDict(frozen=True)

    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0)
    max_items: int = Field(1024, gt=0)
    max_image_pixels: int = Field(4096 * 4096, gt=0)
    queue_timeout_s: float = Field(30.0, gt=0)
    request_timeout_s: float = Field(120.0, gt=0)


class ServiceConfig(ConfigModel):
    model_config = ConfigDict(frozen=True)

    scorers: list[ScorerSpec]
    limits: Limits = Field(default_factory=Limits)
    token: str | None = None
    prefetch_images: bool = True
    """Decode a request's images when it arrives (thread pool, off the event loop, once for every
    image scorer of the process); false: each batch decodes its own images in one call."""
    audit: AuditConfig | None = None
    """Re-score a sample of the proxy's items with auditors and raise alarms (docs/audit.md)."""

    @model_validator(mode="after")
    def _unique_names(self) -> ServiceConfig:
        names = [s.name for s in self.scorers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate scorer names: {dupes}")
        return self

    @model_validator(mode="after")
    def _audited_scorers_hosted(self) -> ServiceConfig:
        missing = [
            n for n in (self.audit.hosted() if self.audit else []) if n not in {s.name for s in self.scorers}
        ]
        if missing:
            raise ValueError(f"audit names scorers this service does not host: {missing}")
        return self

    def resolved_token(self) -> str | None:
        """The configured token, else `REWARDPLANE_TOKEN`; empty means no authentication."""
        return self.token or os.environ.get("REWARDPLANE_TOKEN") or None


def config_from_dict(raw: Any) -> ServiceConfig:
    """Validate a service document by the loader's rules: every scorer's kind registered, its
    options parsed by the kind's model."""
    if not isinstance(raw, dict):
        raise ConfigError("service config must be a mapping with a 'scorers' list")
    scorers = raw.get("scorers")
    if not isinstance(scorers, list) or not scorers:
        raise ConfigError("service config: 'scorers' must be a non-empty list")
    return parse(ServiceConfig, raw)


def load_config(path: str | Path) -> ServiceConfig:
    return config_from_dict(read_yaml(path))


def register_scorer(kind: str, cls: type[Scorer]) -> None:
    """Register a scorer kind in-process (tests, notebooks); packages use the entry-point group."""
    _REGISTERED[kind] = cls


def scorer_registry() -> dict[str, str | type[Scorer]]:
    """kind -> class or "module:attr". Entry points may add kinds but not shadow built-ins."""
    registry: dict[str, str | type[Scorer]] = {}
    for ep in entry_points(group="rewardplane.scorers"):
        registry[ep.name] = ep.value
    registry.update(BUILTIN_SCORERS)
    registry.update(_REGISTERED)
    return registry


def scorer_class(kind: str) -> type[Scorer]:
    """The `Scorer` subclass registered for `kind` (its module imported: scorer modules keep
    torch and model libraries out of import time, so reading a config stays light). ValueError
    for an unknown kind or one that is not a Scorer: the loader reports it at the key."""
    registry = scorer_registry()
    if kind not in registry:
        raise ValueError(f"unknown kind {kind!r}; known: {sorted(registry)}")
    target = registry[kind]
    if isinstance(target, str):
        module_name, _, attr = target.partition(":")
        try:
            target = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"kind {kind!r} does not load ({target}): {type(exc).__name__}: {exc}") from None
    if not (isinstance(target, type) and issubclass(target, Scorer)):
        raise ValueError(f"kind {kind!r} does not resolve to a Scorer subclass")
    return target


def kind_option_schemas(specs: list[ScorerSpec]) -> dict[str, list[dict[str, Any]]]:
    """kind -> its options' schema (`option_schema`), for every kind these specs host, the
    kinds of composites' inline components included: what `GET /v1/scorers` lists."""
    kinds: list[str] = []
    for spec in specs:
        kinds.append(spec.kind)
        kinds += [c.kind for c in getattr(spec.options, "components", ()) if getattr(c, "kind", None)]
    return {kind: option_schema(scorer_class(kind).Options) for kind in dict.fromkeys(kinds)}


def build_scorer(spec: ScorerSpec) -> Scorer:
    """Construct (not load) the scorer for `spec`; `Scorer.load()` does the heavy work."""
    return scorer_class(spec.kind).from_spec(spec)
