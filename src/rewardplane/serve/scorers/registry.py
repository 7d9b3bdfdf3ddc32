"""Scorer kinds: which class serves each kind, and the typed spec of a hosted scorer.

A kind resolves through one registry: the built-ins (`BUILTIN_SCORERS`), the
`rewardplane.scorers` entry-point group (other packages; they may add kinds, not shadow
built-ins) and `register_scorer` (tests, notebooks). `KindSpec` (a kind, its options, its model
source) and `ScorerSpec` (one hosted scorer) are validated against it, so an unknown kind or a
bad option is a one-line error at its dotted key. The service config (`serve/config.py`) lists
`ScorerSpec`s; a composite builds its inline components from `KindSpec`s here, so no scorer
imports the service config.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from pydantic import ConfigDict, Field, SerializeAsAny, ValidationInfo, field_validator, model_validator

from rewardplane.core.config import ConfigModel, Dtype, validate_section
from rewardplane.serve.residency import LifecyclePolicy
from rewardplane.serve.scorers.base import Scorer
from rewardplane.serve.scorers.options import ScorerOptions, option_schema

__all__ = [
    "BUILTIN_SCORERS",
    "KindSpec",
    "ScorerSpec",
    "build_scorer",
    "kind_option_schemas",
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


class ScorerSpec(KindSpec, LifecyclePolicy):
    """One hosted scorer. Model kinds need exactly one of `path` (a local model directory) or
    `shape` (a named random-initialised shape for tests and benchmarks); rules need neither.

    `dtype` takes any of the loader's spellings (fp16, float16, half, ...) and holds the
    canonical one ("fp32" / "fp16" / "bf16"). Frozen: a spec is the scorer's identity. Its
    residency settings are a `LifecyclePolicy`'s (`serve/residency.py`), typed and checked there;
    the lifecycle's policy is derived from the spec.
    """

    name: str
    max_batch_size: int = Field(32, ge=1)
    max_wait_ms: float = Field(5.0, ge=0)
    max_queue: int = Field(4096, ge=1)
    token_budget: int | None = Field(None, ge=1)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        if not name or "/" in name:
            raise ValueError(f"must be a non-empty string without '/', got {name!r}")
        return name


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
