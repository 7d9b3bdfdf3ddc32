"""The qualify plan (what to deploy, how to load it, what counts as a pass, which goals to measure)
and its expansion into the deployments that are started one after another.

`dedicated` gives each scorer its own GPU. With fewer GPUs than scorers it is measured by
isolation: each scorer alone in its own deployment, every item still needing every scorer,
so it holds one GPU per scorer. Every other mode holds one GPU. The order is dtype-major
(dedicated, shared, mps at each listed percentage, consolidated), so each dtype's table
completes before the next dtype starts.

The plan is read by the project's one config loader (core/config.py): unknown keys, wrong
types and bad values are one-line `ConfigError`s naming the dotted key, dtypes take the
loader's spellings, and `key=value` overrides work as they do for every other config.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, field_validator, model_validator

from rewardplane.bench.sweep import Sweep
from rewardplane.core.config import ConfigModel, Dtype, canonical_dtype, load, parse, validate_section
from rewardplane.core.errors import ConfigError
from rewardplane.deploy.config import PLACEMENT_KEYS
from rewardplane.serve.scorers.registry import ScorerSpec

DEFAULT_ATOL = {"fp16": 1e-3, "bf16": 1e-3, "fp32": 1e-5}
MODE_ORDER = ("dedicated", "shared", "mps", "consolidated")
DEFAULT_COMMAND = ["{python}", "-m", "rewardplane", "serve", "--deploy", "{deploy}", "--port", "{port}"]
_FROZEN = ConfigDict(frozen=True)


class Goals(ConfigModel):
    """The targets each dtype is measured against (`summary.json` → `goals`). They are plan data,
    not code, because they belong to the question a plan asks: a later plan can ask another.
    Goals are findings and never change the exit code; validity and parity do."""

    model_config = _FROZEN

    mps_vs_shared_items_per_s: float = Field(1.15, gt=0)
    """Each mps<pct> mode's mean items/s over shared's, on the load points GPU-bound in both."""
    consolidated_vs_dedicated_per_gpu_hour: float = Field(2.0, gt=0)
    """Consolidated's rewards per GPU-hour over dedicated's (items/s scaled by GPUs held)."""


class Server(ConfigModel):
    """How each deployment's server is started and stopped (bench/server.py). `command` is a
    template: `{python}`, `{deploy}` (the deploy file qualify writes) and `{port}` are filled in."""

    model_config = _FROZEN

    command: list[str] = Field(default_factory=lambda: list(DEFAULT_COMMAND), min_length=1)
    env: dict[str, str | int | float | bool] = Field(default_factory=dict)
    ready_timeout_s: float = Field(300.0, gt=0)
    stop_timeout_s: float = Field(30.0, gt=0)
    token: str | None = None


class ModePlan(ConfigModel):
    """One `modes:` entry: a mode name, or `{mode: mps, active_thread_percentages: [...]}`."""

    model_config = _FROZEN

    mode: Literal["dedicated", "shared", "mps", "consolidated"]
    active_thread_percentages: list[int] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        data = {"mode": data} if isinstance(data, str) else data
        if isinstance(data, dict) and data.get("mode") == "mps" and not data.get("active_thread_percentages"):
            data = {**data, "active_thread_percentages": [100]}
        return data

    @model_validator(mode="after")
    def _percentages(self) -> ModePlan:
        pcts = self.active_thread_percentages
        if self.mode != "mps" and pcts:
            raise ValueError(f"active_thread_percentages only applies to mps, not {self.mode}")
        if any(not 1 <= p <= 100 for p in pcts):
            raise ValueError(f"active_thread_percentages must be integers in 1-100, got {pcts}")
        return self

    @property
    def mps_percentages(self) -> tuple[int, ...]:
        return tuple(self.active_thread_percentages)


def _serve_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A plan's scorer, checked as the serve spec it becomes (kind, options, path or shape) when
    the plan is read, not when its deployment starts minutes later."""
    validate_section(ScorerSpec, {k: v for k, v in spec.items() if k not in PLACEMENT_KEYS})
    return spec


class Plan(ConfigModel):
    """A qualify plan (docs/qualify.md, "Plan keys"). Unknown keys are errors: a misspelt key
    silently falling back to a default would measure the wrong thing."""

    model_config = _FROZEN

    scorers: list[Annotated[dict[str, Any], AfterValidator(_serve_spec)]] = Field(min_length=1)
    """serve scorer specs WITHOUT dtype (deploy keys such as memory_fraction pass through)."""
    dtypes: list[Dtype] = Field(default_factory=lambda: ["fp32"], min_length=1)
    modes: list[ModePlan] = Field(default_factory=lambda: [ModePlan(mode=m) for m in MODE_ORDER])
    gpus: list[int] = Field(default_factory=lambda: [0])
    sweep: Sweep = Field(default_factory=Sweep)
    """The load every deployment gets: `rewardplane bench`'s sweep (bench/sweep.py), one definition."""
    server: Server = Field(default_factory=Server)
    atol: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_ATOL))
    """Parity tolerance per dtype; the ones given replace DEFAULT_ATOL's."""
    service: dict[str, Any] = Field(default_factory=dict)
    allow_reduced_precision_partition: bool = False
    budget_s: float | None = Field(None, ge=0)
    inputs: str | None = None
    goals: Goals = Field(default_factory=Goals)

    @field_validator("scorers")
    @classmethod
    def _scorers(cls, scorers: list[dict[str, Any]]) -> list[dict[str, Any]]:
        names = [s.get("name") for s in scorers]
        if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
            raise ValueError("must each have a unique name")
        for s in scorers:
            if "dtype" in s or "mps_active_thread_percentage" in s:
                raise ConfigError(
                    f"scorers[{s['name']}]: set dtype via `dtypes:` and MPS shares via `modes:`"
                )
        return scorers

    @field_validator("modes")
    @classmethod
    def _modes(cls, modes: list[ModePlan]) -> list[ModePlan]:
        if "dedicated" not in [m.mode for m in modes]:
            raise ValueError("must include dedicated (the reference for ratios and parity)")
        return sorted(modes, key=lambda m: MODE_ORDER.index(m.mode))

    @field_validator("atol", mode="before")
    @classmethod
    def _atol(cls, atol: Any) -> Any:
        if not isinstance(atol, dict):
            return atol
        given = {canonical_dtype(k): float(v) if isinstance(v, str) else v for k, v in atol.items()}
        return {**DEFAULT_ATOL, **given}

    @property
    def isolation(self) -> bool:
        return len(self.gpus) < len(self.scorers)

    @property
    def scorer_names(self) -> list[str]:
        return [s["name"] for s in self.scorers]


@dataclass(frozen=True)
class Deployment:
    """One `serve --deploy` process: its file, the scorers benchmarked against it, its label."""

    label: str  # e.g. "mps50/fp16", "dedicated:clip_h/fp16"
    group: str  # the mode label the summary reports: "dedicated", "mps50", ...
    mode: str
    dtype: str
    doc: dict[str, Any]
    scorers: list[str]
    gpus_held: int
    mps_percentage: int | None = None


def parse_plan(raw: Any) -> Plan:
    """A plan from an already-read mapping."""
    return parse(Plan, raw)


def load_plan(path: str | Path, overrides: Iterable[str] = ()) -> Plan:
    """A plan from its YAML file plus dotted `key=value` overrides (`sweep.window_s=2`)."""
    return load(Plan, path, overrides)


def _scorer_doc(spec: dict[str, Any], dtype: str, gpu: int | None, pct: int | None) -> dict[str, Any]:
    doc = {**spec, "dtype": dtype}
    if gpu is not None:
        doc["gpu"] = gpu
    if pct is not None:
        doc["mps_active_thread_percentage"] = pct
    return doc


def expand(plan: Plan) -> list[Deployment]:
    """Every deployment of the plan, in run order (dtype-major so each dtype's table completes)."""
    first = plan.gpus[0] if plan.gpus else None
    one_gpu = [first] if first is not None else []
    names = plan.scorer_names
    out = []
    for dtype in plan.dtypes:
        for m in plan.modes:
            base = {**plan.service, "gpus": one_gpu}
            if m.mode == "dedicated" and plan.isolation:
                for spec in plan.scorers:
                    doc = {**base, "mode": "dedicated", "scorers": [_scorer_doc(spec, dtype, first, None)]}
                    label = f"dedicated:{spec['name']}/{dtype}"
                    out.append(
                        Deployment(label, "dedicated", "dedicated", dtype, doc, [spec["name"]], len(names))
                    )
            elif m.mode == "dedicated":
                gpus = plan.gpus[: len(plan.scorers)]
                specs = [_scorer_doc(s, dtype, g, None) for s, g in zip(plan.scorers, gpus, strict=True)]
                doc = {**base, "mode": "dedicated", "gpus": gpus, "scorers": specs}
                out.append(
                    Deployment(f"dedicated/{dtype}", "dedicated", "dedicated", dtype, doc, names, len(gpus))
                )
            elif m.mode == "mps":
                for pct in m.mps_percentages:
                    specs = [_scorer_doc(s, dtype, first, pct) for s in plan.scorers]
                    doc = {**base, "mode": "mps", "scorers": specs}
                    if plan.allow_reduced_precision_partition:
                        doc["allow_reduced_precision_partition"] = True
                    out.append(Deployment(f"mps{pct}/{dtype}", f"mps{pct}", "mps", dtype, doc, names, 1, pct))
            else:
                specs = [_scorer_doc(s, dtype, first, None) for s in plan.scorers]
                doc = {**base, "mode": m.mode, "scorers": specs}
                out.append(Deployment(f"{m.mode}/{dtype}", m.mode, m.mode, dtype, doc, names, 1))
    return out


def estimate_s(plan: Plan) -> tuple[float, float]:
    """(minimum, maximum) measurement seconds, excluding start-up and warm-up."""
    s = plan.sweep
    n = len(expand(plan)) * len(s.batch) * len(s.concurrency) * s.repetitions * s.window_s
    return n * s.stable_windows, n * s.max_windows
