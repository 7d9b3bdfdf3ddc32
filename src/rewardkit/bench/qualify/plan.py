"""The qualify plan (what to deploy, how to load it, what counts as a pass, which goals to measure)
and its expansion into the deployments that are started one after another.

`dedicated` gives each scorer its own GPU. With fewer GPUs than scorers it is measured by
isolation: each scorer alone in its own deployment, every item still needing every scorer,
so it holds one GPU per scorer. Every other mode holds one GPU. The order is dtype-major
(dedicated, shared, mps at each listed percentage, consolidated), so each dtype's table
completes before the next dtype starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rewardkit.core.errors import ConfigError

DEFAULT_ATOL = {"fp16": 1e-3, "bf16": 1e-3, "fp32": 1e-5}
MODE_ORDER = ("dedicated", "shared", "mps", "consolidated")
DEFAULT_COMMAND = ["{python}", "-m", "rewardkit", "serve", "--deploy", "{deploy}", "--port", "{port}"]
_PLAN_KEYS = {"gpus", "scorers", "dtypes", "modes", "sweep", "server", "atol", "service", "budget_s"}
_PLAN_KEYS |= {"allow_reduced_precision_partition", "inputs", "goals"}
_SWEEP_KEYS = {"batch", "concurrency", "requests", "warmup", "repetitions", "window_s", "stable_windows"}
_SWEEP_KEYS |= {"tolerance", "max_windows", "slo_ms", "corpus_size", "seed", "images", "timeout_s"}
_SERVER_KEYS = {"command", "env", "ready_timeout_s", "stop_timeout_s", "token"}


@dataclass(frozen=True)
class Goals:
    """The targets each dtype is measured against (`summary.json` → `goals`). They are plan data,
    not code, because they belong to the issue that asked the question: a later plan can ask a
    different one. Goals are findings and never change the exit code; validity and parity do."""

    # each mps<pct> group's mean items/s over shared's, on the points GPU-bound in both
    mps_vs_shared_items_per_s: float = 1.15
    # consolidated's rewards per GPU-hour over dedicated's (scaled by GPUs held)
    consolidated_vs_dedicated_per_gpu_hour: float = 2.0


@dataclass(frozen=True)
class ModePlan:
    mode: str
    mps_percentages: tuple[int, ...] = ()


@dataclass(frozen=True)
class Plan:
    scorers: list[dict[str, Any]]
    dtypes: list[str]
    modes: list[ModePlan]
    gpus: list[int] = field(default_factory=lambda: [0])
    sweep: dict[str, Any] = field(default_factory=dict)
    server: dict[str, Any] = field(default_factory=dict)
    atol: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_ATOL))
    service: dict[str, Any] = field(default_factory=dict)
    allow_reduced_precision_partition: bool = False
    budget_s: float | None = None
    inputs: str | None = None
    goals: Goals = field(default_factory=Goals)

    @property
    def isolation(self) -> bool:
        return len(self.gpus) < len(self.scorers)


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


def _check_keys(raw: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; known: {sorted(known)}")


def _goals(raw: Any) -> Goals:
    raw = dict(raw or {})
    known = set(Goals.__dataclass_fields__)
    _check_keys(raw, known, "goals")
    return Goals(**{k: float(v) for k, v in raw.items()})


def parse_plan(raw: Any) -> Plan:
    if not isinstance(raw, dict):
        raise ConfigError("plan: top level must be a mapping")
    _check_keys(raw, _PLAN_KEYS, "plan")
    scorers = raw.get("scorers")
    if not isinstance(scorers, list) or not scorers or not all(isinstance(s, dict) for s in scorers):
        raise ConfigError("scorers: expected a non-empty list of scorer specs")
    names = [s.get("name") for s in scorers]
    if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
        raise ConfigError("scorers: every scorer needs a unique name")
    for s in scorers:
        if "dtype" in s or "mps_active_thread_percentage" in s:
            raise ConfigError(f"scorers[{s['name']}]: set dtype via `dtypes:` and MPS shares via `modes:`")
    dtypes = raw.get("dtypes", ["fp32"])
    if not isinstance(dtypes, list) or not dtypes or any(d not in DEFAULT_ATOL for d in dtypes):
        raise ConfigError(f"dtypes: expected a list drawn from {sorted(DEFAULT_ATOL)}")
    modes = []
    for entry in raw.get("modes", list(MODE_ORDER)):
        mode, pcts = (entry, ()) if isinstance(entry, str) else (entry.get("mode"), ())
        if isinstance(entry, dict):
            _check_keys(entry, {"mode", "active_thread_percentages"}, f"modes[{mode}]")
            pcts = tuple(entry.get("active_thread_percentages", ()))
        if mode not in MODE_ORDER:
            raise ConfigError(f"modes: {mode!r} is not one of {', '.join(MODE_ORDER)}")
        if mode == "mps":
            pcts = pcts or (100,)
            if any(isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= 100 for p in pcts):
                raise ConfigError("modes[mps].active_thread_percentages: integers in 1-100")
        elif pcts:
            raise ConfigError(f"modes[{mode}]: active_thread_percentages only applies to mps")
        modes.append(ModePlan(mode, pcts))
    if "dedicated" not in [m.mode for m in modes]:
        raise ConfigError("modes: must include dedicated (the reference for ratios and parity)")
    modes.sort(key=lambda m: MODE_ORDER.index(m.mode))
    sweep = dict(raw.get("sweep") or {})
    _check_keys(sweep, _SWEEP_KEYS, "sweep")
    server = dict(raw.get("server") or {})
    _check_keys(server, _SERVER_KEYS, "server")
    gpus = raw.get("gpus", [0])
    if not isinstance(gpus, list) or not all(isinstance(g, int) and not isinstance(g, bool) for g in gpus):
        raise ConfigError("gpus: expected a list of GPU indices ([] for a CPU-only run)")
    budget = raw.get("budget_s")
    return Plan(
        scorers=scorers,
        dtypes=dtypes,
        modes=modes,
        gpus=gpus,
        sweep=sweep,
        server=server,
        atol={**DEFAULT_ATOL, **{k: float(v) for k, v in (raw.get("atol") or {}).items()}},
        service=dict(raw.get("service") or {}),
        allow_reduced_precision_partition=bool(raw.get("allow_reduced_precision_partition", False)),
        budget_s=None if budget is None else float(budget),
        inputs=raw.get("inputs"),
        goals=_goals(raw.get("goals")),
    )


def load_plan(path: str | Path) -> Plan:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from None
    return parse_plan(raw)


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
    names = [s["name"] for s in plan.scorers]
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
    points = len(s.get("batch", [1, 8, 32])) * len(s.get("concurrency", [1, 4, 16])) * s.get("repetitions", 1)
    window = float(s.get("window_s", 5.0))
    n = len(expand(plan)) * points * window
    return n * int(s.get("stable_windows", 3)), n * int(s.get("max_windows", 10))
