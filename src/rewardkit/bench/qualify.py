"""`rewardkit qualify`: the same sweep against each deployment mode, started and stopped here.

For every dtype in the plan, deployments run in this order: dedicated, shared, mps at each
listed active-thread percentage, consolidated. Each is a `rewardkit serve --deploy` process
that qualify writes the deploy file for, waits on (`/health/ready`, bounded), benchmarks with
the seeded corpus and stops (SIGTERM, then SIGKILL after `stop_timeout_s`).

`dedicated` gives each scorer its own GPU. With fewer GPUs than scorers it is measured by
isolation: each scorer alone in its own deployment, every item still needing every scorer,
so the dedicated layout's items/s at a load point is the slowest scorer's, and it holds one
GPU per scorer. Every other mode holds one GPU. Rewards per GPU-hour = items/s × 3600 / GPUs
held; parity compares every item's score with the dedicated run's, per scorer.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

from rewardkit.bench import report
from rewardkit.bench.corpus import generate_corpus, load_inputs
from rewardkit.bench.sweep import BenchConfig, run_bench
from rewardkit.bench.windows import WindowPolicy
from rewardkit.core.atomic import write_json, write_text
from rewardkit.core.errors import ConfigError, RewardkitError

log = logging.getLogger(__name__)

SUMMARY_VERSION = "rewardkit.qualify_summary/1"
DEFAULT_ATOL = {"fp16": 1e-3, "bf16": 1e-3, "fp32": 1e-5}
MODE_ORDER = ("dedicated", "shared", "mps", "consolidated")
DEFAULT_COMMAND = ["{python}", "-m", "rewardkit", "serve", "--deploy", "{deploy}", "--port", "{port}"]
_PLAN_KEYS = {"gpus", "scorers", "dtypes", "modes", "sweep", "server", "atol", "service", "budget_s"}
_PLAN_KEYS |= {"allow_reduced_precision_partition", "inputs"}
_SWEEP_KEYS = {"batch", "concurrency", "requests", "warmup", "repetitions", "window_s", "stable_windows"}
_SWEEP_KEYS |= {"tolerance", "max_windows", "slo_ms", "corpus_size", "seed", "images", "timeout_s"}
_SERVER_KEYS = {"command", "env", "ready_timeout_s", "stop_timeout_s", "token"}


class QualifyError(RewardkitError):
    code = "qualify"


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
    out = []
    for dtype in plan.dtypes:
        for m in plan.modes:
            base = {**plan.service, "gpus": one_gpu}
            if m.mode == "dedicated" and plan.isolation:
                for spec in plan.scorers:
                    doc = {**base, "mode": "dedicated", "scorers": [_scorer_doc(spec, dtype, first, None)]}
                    out.append(
                        Deployment(
                            f"dedicated:{spec['name']}/{dtype}", "dedicated", "dedicated", dtype, doc,
                            [spec["name"]], len(plan.scorers),
                        )
                    )  # fmt: skip
            elif m.mode == "dedicated":
                gpus = plan.gpus[: len(plan.scorers)]
                specs = [_scorer_doc(s, dtype, g, None) for s, g in zip(plan.scorers, gpus, strict=True)]
                doc = {**base, "mode": "dedicated", "gpus": gpus, "scorers": specs}
                names = [s["name"] for s in plan.scorers]
                out.append(
                    Deployment(f"dedicated/{dtype}", "dedicated", "dedicated", dtype, doc, names, len(gpus))
                )
            elif m.mode == "mps":
                for pct in m.mps_percentages:
                    specs = [_scorer_doc(s, dtype, first, pct) for s in plan.scorers]
                    doc = {**base, "mode": "mps", "scorers": specs}
                    if plan.allow_reduced_precision_partition:
                        doc["allow_reduced_precision_partition"] = True
                    names = [s["name"] for s in plan.scorers]
                    out.append(Deployment(f"mps{pct}/{dtype}", f"mps{pct}", "mps", dtype, doc, names, 1, pct))
            else:
                specs = [_scorer_doc(s, dtype, first, None) for s in plan.scorers]
                doc = {**base, "mode": m.mode, "scorers": specs}
                names = [s["name"] for s in plan.scorers]
                out.append(Deployment(f"{m.mode}/{dtype}", m.mode, m.mode, dtype, doc, names, 1))
    return out


def _slug(label: str) -> str:
    return label.replace("/", "-").replace(":", "-")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _terminate_with_parent() -> None:
    """In the server child (Linux): SIGTERM it if qualify dies, even by SIGKILL (a device time
    limit), so the gateway still drains, stops its workers and quits the MPS daemon it started.
    Its own session protects it from our process group, so nothing else would tell it."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)


@contextlib.contextmanager
def running(dep: Deployment, workdir: Path, server: dict[str, Any]) -> Iterator[tuple[str, float]]:
    """Start the deployment, wait until ready (bounded), yield (base URL, startup seconds), stop it."""
    workdir.mkdir(parents=True, exist_ok=True)
    deploy_path = workdir / "deploy.yaml"
    write_text(deploy_path, yaml.safe_dump(dep.doc, sort_keys=False))
    port = _free_port()
    template = server.get("command") or DEFAULT_COMMAND
    fields = {"python": sys.executable, "deploy": str(deploy_path), "port": str(port)}
    command = [str(part).format(**fields) for part in template]
    env = {**os.environ, **{k: str(v) for k, v in (server.get("env") or {}).items()}}
    log_path = workdir / "server.log"
    ready_timeout = float(server.get("ready_timeout_s", 300))
    stop_timeout = float(server.get("stop_timeout_s", 30))
    url = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    with open(log_path, "wb") as log_file:
        # own session: a stuck deployment's workers can be killed as a group without touching ours
        proc = subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_terminate_with_parent,
        )
    try:
        deadline = started + ready_timeout
        while True:
            if proc.poll() is not None:
                raise QualifyError(
                    f"{dep.label}: server exited with code {proc.returncode} before ready; "
                    f"log tail:\n{_log_tail(log_path)}"
                )
            try:
                if httpx.get(url + "/health/ready", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.perf_counter() > deadline:
                raise QualifyError(
                    f"{dep.label}: not ready after {ready_timeout:.0f} s; log tail:\n{_log_tail(log_path)}"
                )
            time.sleep(0.25)
        yield url, time.perf_counter() - started
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=stop_timeout)
            except subprocess.TimeoutExpired:
                log.warning(
                    "%s: no exit %.0f s after SIGTERM; killing its process group", dep.label, stop_timeout
                )
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _bench_config(plan: Plan, dep: Deployment, url: str) -> BenchConfig:
    s = plan.sweep
    policy = WindowPolicy(
        float(s.get("window_s", 5.0)),
        int(s.get("stable_windows", 3)),
        float(s.get("tolerance", 0.10)),
        int(s.get("max_windows", 10)),
    )
    return BenchConfig(
        url=url,
        scorers=dep.scorers,
        batches=list(s.get("batch", [1, 8, 32])),
        concurrencies=list(s.get("concurrency", [1, 4, 16])),
        requests=int(s.get("requests", 60)),
        warmup=int(s.get("warmup", 5)),
        repetitions=int(s.get("repetitions", 1)),
        policy=policy,
        slo_ms=s.get("slo_ms"),
        token=plan.server.get("token") or os.environ.get("REWARDKIT_TOKEN"),
        timeout_s=float(s.get("timeout_s", 60.0)),
        seed=int(s.get("seed", 0)),
        gpu_indices=[g for g in plan.gpus[: dep.gpus_held]] or None,
        mode=dep.group,
        coverage_pass=True,
    )


def estimate_s(plan: Plan) -> tuple[float, float]:
    """(minimum, maximum) measurement seconds, excluding start-up and warm-up."""
    s = plan.sweep
    points = len(s.get("batch", [1, 8, 32])) * len(s.get("concurrency", [1, 4, 16])) * s.get("repetitions", 1)
    window = float(s.get("window_s", 5.0))
    n = len(expand(plan)) * points * window
    return n * int(s.get("stable_windows", 3)), n * int(s.get("max_windows", 10))


def dry_run(plan: Plan, out: Path) -> str:
    deployments = expand(plan)
    lines = []
    for dep in deployments:
        path = out / "deployments" / _slug(dep.label) / "deploy.yaml"
        write_text(path, yaml.safe_dump(dep.doc, sort_keys=False))
        lines.append(f"{dep.label:36s} scorers={','.join(dep.scorers):24s} gpus_held={dep.gpus_held}  {path}")
    low, high = estimate_s(plan)
    lines.append(
        f"{len(deployments)} deployments; measurement {low:.0f}-{high:.0f} s plus start-up/warm-up per deployment"
        + ("" if not plan.isolation else "; dedicated measured by isolation (fewer GPUs than scorers)")
    )
    return "\n".join(lines)


# ---- aggregation -------------------------------------------------------------------------


def _key(point: dict[str, Any]) -> tuple[int, int | None, float | None]:
    return point["batch"], point["concurrency"], point["rate"]


def _combine_isolation(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per load point, the dedicated layout's view: slowest scorer's items/s, worst latencies."""
    by_key: dict[Any, list[dict[str, Any]]] = {}
    for run in runs:
        for p in run["points"]:
            by_key.setdefault(_key(p), []).append(p)
    combined = []
    for key, pts in by_key.items():
        if len(pts) != len(runs):
            continue
        worst = min(pts, key=lambda p: p["items_per_s"])
        regimes = {p["regime"] for p in pts}
        combined.append(
            {
                "batch": key[0],
                "concurrency": key[1],
                "rate": key[2],
                "items_per_s": worst["items_per_s"],
                "p95_ms": max((p["latency_ms"]["p95"] or 0.0) for p in pts),
                "regime": regimes.pop() if len(regimes) == 1 else "mixed",
                "gpu_util_mean": _mean([(p["resources"] or {}).get("gpu_util_mean") for p in pts]),
                "stable": all(p["stable"] for p in pts),
            }
        )
    return sorted(combined, key=lambda p: (p["batch"], p["concurrency"] or 0, p["rate"] or 0))


def _point_view(p: dict[str, Any]) -> dict[str, Any]:
    return {
        "batch": p["batch"],
        "concurrency": p["concurrency"],
        "rate": p["rate"],
        "items_per_s": p["items_per_s"],
        "p95_ms": p["latency_ms"]["p95"],
        "regime": p["regime"],
        "gpu_util_mean": (p["resources"] or {}).get("gpu_util_mean"),
        "stable": p["stable"],
    }


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def parity(reference: dict[str, dict[str, float]], candidate: dict[str, dict[str, float]], scorers: list[str],
           atol: float, reference_spread: dict[str, float]) -> dict[str, Any]:  # fmt: skip
    """Per scorer: |candidate - reference| over the item ids both scored, and coverage."""
    out = {}
    for scorer in scorers:
        ids = [i for i, s in reference.items() if scorer in s]
        both = [i for i in ids if scorer in candidate.get(i, {})]
        deltas = np.array([abs(candidate[i][scorer] - reference[i][scorer]) for i in both])
        max_delta = float(deltas.max()) if both else None
        out[scorer] = {
            "compared": len(both),
            "missing": len(ids) - len(both),
            "max_abs_delta": max_delta,
            "p99_abs_delta": float(np.percentile(deltas, 99)) if both else None,
            "atol": atol,
            "reference_self_spread": reference_spread.get(scorer),
            "pass": bool(both) and len(both) == len(ids) and max_delta <= atol,
        }
    return out


def _validity(runs: list[dict[str, Any]]) -> dict[str, Any]:
    reasons: dict[str, int] = {}
    codes: dict[str, int] = {}
    for run in runs:
        for k, v in run["totals"]["failures_by_reason"].items():
            reasons[k] = reasons.get(k, 0) + v
        for k, v in run["totals"]["item_errors_by_code"].items():
            codes[k] = codes.get(k, 0) + v
    return {
        "requests": sum(r["totals"]["requests"] for r in runs),
        "ok": sum(r["totals"]["ok"] for r in runs),
        "failed": sum(r["totals"]["failed"] for r in runs),
        "failures_by_reason": reasons,
        "item_errors_by_code": codes,
    }


def gpu_ms_per_item(run: dict[str, Any]) -> float | None:
    """A scorer's GPU-busy milliseconds per item when it ran alone: NVML utilisation (the share
    of time a kernel was running) over items/s, averaged over its load points. An estimate
    from sampling, but it needs no profiler and matches CUDA-event tower times on the H200
    (docs/benchmarks/qualification-h200.md)."""
    values = [
        (p["resources"] or {}).get("gpu_util_mean") / 100 * 1000 / p["items_per_s"]
        for p in run["points"]
        if (p["resources"] or {}).get("gpu_util_mean") is not None and p["items_per_s"] > 0
    ]
    return float(np.mean(values)) if values else None


def equal_utilisation_ceiling(ms_per_item: dict[str, float | None]) -> float | None:
    """Consolidated / dedicated-by-isolation rewards per GPU-hour if both kept their GPUs
    equally busy: n · max(t) / Σ t. Dedicated holds n GPUs and answers at the slowest scorer's
    rate; consolidated does every scorer's GPU work on one GPU."""
    times = list(ms_per_item.values())
    if not times or any(t is None or t <= 0 for t in times):
        return None
    return len(times) * max(times) / sum(times)


def _group_record(deps: list[Deployment], runs: list[dict[str, Any]], startup: list[float]) -> dict[str, Any]:
    dep = deps[0]
    points = _combine_isolation(runs) if len(runs) > 1 else [_point_view(p) for p in runs[0]["points"]]
    rates = [p["items_per_s"] for p in points]
    mean = float(np.mean(rates)) if rates else 0.0
    gpu_bound = [p["items_per_s"] for p in points if p["regime"] == "gpu_bound"]
    regimes = sorted({p["regime"] for p in points})
    return {
        "group": dep.group,
        "mode": dep.mode,
        "dtype": dep.dtype,
        "mps_active_thread_percentage": dep.mps_percentage,
        "isolation": ":" in dep.label,
        "deployments": [d.label for d in deps],
        "gpus_held": dep.gpus_held,
        "status": "ok",
        "error": None,
        "startup_s": startup,
        "items_per_s_mean": mean,
        "items_per_s_peak": max(rates, default=0.0),
        "items_per_s_mean_gpu_bound": float(np.mean(gpu_bound)) if gpu_bound else None,
        "rewards_per_gpu_hour": mean * 3600 / dep.gpus_held,
        "regimes": regimes,
        "gpu_util_mean": _mean([p["gpu_util_mean"] for p in points]),
        "unstable_points": sum(not p["stable"] for p in points),
        "validity": _validity(runs),
        # per scorer alone: what bounds the consolidated goal (`equal_utilisation_ceiling`)
        "gpu_ms_per_item": {d.scorers[0]: gpu_ms_per_item(r) for d, r in zip(deps, runs, strict=True)}
        if len(runs) > 1
        else None,
        "points": points,
    }


def _compare(a: dict[str, Any], b: dict[str, Any], target: float, per_gpu: bool) -> dict[str, Any] | None:
    """a/b on the load points that are GPU-bound in both (the issue's goals are stated there);
    on all shared points when there are none, and the `basis` says which was used."""
    pa = {_key(p): p for p in a["points"]}
    pb = {_key(p): p for p in b["points"]}
    common = [k for k in pa if k in pb]
    gpu_bound = [k for k in common if pa[k]["regime"] == pb[k]["regime"] == "gpu_bound"]
    keys, basis = (
        (gpu_bound, "gpu_bound points") if gpu_bound else (common, "all points (none GPU-bound in both)")
    )
    mean_b = float(np.mean([pb[k]["items_per_s"] for k in keys])) if keys else 0.0
    if mean_b <= 0:
        return None
    ratio = float(np.mean([pa[k]["items_per_s"] for k in keys])) / mean_b
    if per_gpu:
        ratio *= b["gpus_held"] / a["gpus_held"]
    return {"value": ratio, "target": target, "met": ratio >= target, "basis": basis, "points": len(keys)}


def _goals(groups: list[dict[str, Any]], dtype: str) -> dict[str, Any]:
    ok = [g for g in groups if g["dtype"] == dtype and g["status"] == "ok"]
    by = {g["group"]: g for g in ok}
    shared, dedicated, consolidated = by.get("shared"), by.get("dedicated"), by.get("consolidated")
    goals: dict[str, Any] = {
        "all_valid": all(g["validity"]["failed"] == 0 for g in ok)
        and len(ok) == len([g for g in groups if g["dtype"] == dtype]),
        "parity": all(all(v["pass"] for v in (g["parity"] or {}).values()) for g in ok),
    }
    for g in ok:
        if g["mode"] == "mps" and shared is not None:
            goal = _compare(g, shared, 1.15, per_gpu=False)
            if goal is not None:
                goals[f"{g['group']}_vs_shared_items_per_s"] = goal
    if consolidated is not None and dedicated is not None:
        goal = _compare(consolidated, dedicated, 2.0, per_gpu=True)
        if goal is not None:
            if dedicated.get("gpu_ms_per_item"):
                goal["equal_utilisation_ceiling"] = equal_utilisation_ceiling(dedicated["gpu_ms_per_item"])
                goal["gpu_ms_per_item"] = dedicated["gpu_ms_per_item"]
            goals["consolidated_vs_dedicated_per_gpu_hour"] = goal
    return goals


def summarize(plan: Plan, deployments: list[Deployment], runs: dict[str, dict[str, Any]],
              startup: dict[str, float], errors: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    groups: list[dict[str, Any]] = []
    for dtype in plan.dtypes:
        order: list[str] = []
        for d in deployments:
            if d.dtype == dtype and d.group not in order:
                order.append(d.group)
        for group in order:
            deps = [d for d in deployments if d.dtype == dtype and d.group == group]
            failed = [errors[d.label] for d in deps if d.label in errors]
            if failed:
                groups.append({"group": group, "mode": deps[0].mode, "dtype": dtype, "status": "failed",
                               "error": "; ".join(failed), "deployments": [d.label for d in deps],
                               "gpus_held": deps[0].gpus_held, "parity": None})  # fmt: skip
                continue
            groups.append(
                _group_record(deps, [runs[d.label] for d in deps], [startup[d.label] for d in deps])
            )
        reference = next((g for g in groups if g["dtype"] == dtype and g["group"] == "dedicated"), None)
        ref_ok = reference is not None and reference["status"] == "ok"
        ref_scores: dict[str, dict[str, float]] = {}
        ref_spread: dict[str, float] = {}
        if ref_ok:
            for label in reference["deployments"]:
                for item_id, scores in runs[label]["scores"].items():
                    ref_scores.setdefault(item_id, {}).update(scores)
                ref_spread.update(runs[label]["score_spread"])
        for g in groups:
            if g["dtype"] != dtype or g["status"] != "ok":
                continue
            g["parity"] = None
            g["ratio_vs_dedicated"] = None
            if g["group"] == "dedicated" or not ref_ok:
                continue
            (label,) = g["deployments"]
            g["parity"] = parity(ref_scores, runs[label]["scores"], [s["name"] for s in plan.scorers],
                                 plan.atol[dtype], ref_spread)  # fmt: skip
            g["ratio_vs_dedicated"] = {
                "items_per_s": g["items_per_s_mean"] / reference["items_per_s_mean"]
                if reference["items_per_s_mean"]
                else None,
                "rewards_per_gpu_hour": g["rewards_per_gpu_hour"] / reference["rewards_per_gpu_hour"]
                if reference["rewards_per_gpu_hour"]
                else None,
            }
    failures = []
    for g in groups:
        name = f"{g['group']}/{g['dtype']}"
        if g["status"] != "ok":
            failures.append(f"{name}: deployment failed: {g['error'].splitlines()[0]}")
            continue
        v = g["validity"]
        if v["failed"]:
            reasons = ", ".join(f"{k}={n}" for k, n in sorted(v["failures_by_reason"].items()))
            codes = ", ".join(f"{k}={n}" for k, n in sorted(v["item_errors_by_code"].items()))
            failures.append(
                f"{name}: {v['failed']}/{v['requests']} requests failed ({reasons})"
                + (f"; per-item error codes: {codes}" if codes else "")
            )
        for scorer, p in (g["parity"] or {}).items():
            if not p["pass"]:
                failures.append(
                    f"{name}: parity failed for {scorer}: max |delta| {p['max_abs_delta']} > atol {p['atol']:g} "
                    f"(p99 {p['p99_abs_delta']}, {p['missing']} items missing)"
                )
    first_run = next(iter(runs.values()), None)
    return {
        "schema_version": SUMMARY_VERSION,
        "isolation": plan.isolation,
        "gpus": plan.gpus,
        "scorers": plan.scorers,
        "dtypes": plan.dtypes,
        "sweep": plan.sweep,
        "atol": plan.atol,
        "environment": first_run["environment"] if first_run else None,
        "corpus": first_run["corpus"] if first_run else None,
        "groups": groups,
        "goals": {dtype: _goals(groups, dtype) for dtype in plan.dtypes},
        "failures": failures,
        "passed": not failures,
    }


def qualify(plan: Plan, out: Path) -> dict[str, Any]:
    """Run every deployment of the plan, write runs/, summary.json, results.csv, report.md, plots."""
    deployments = expand(plan)
    s = plan.sweep
    if plan.inputs:
        corpus, info = load_inputs(plan.inputs), {"source": str(plan.inputs)}
    else:
        images = bool(s.get("images", True))
        seed = int(s.get("seed", 0))
        corpus = generate_corpus(int(s.get("corpus_size", 256)), seed=seed, images=images)
        info = {"source": "generated", "seed": seed, "images": images}
    runs: dict[str, dict[str, Any]] = {}
    startup: dict[str, float] = {}
    errors: dict[str, str] = {}
    started = time.perf_counter()
    for i, dep in enumerate(deployments, 1):
        elapsed = time.perf_counter() - started
        if i > 1 and plan.budget_s is not None and elapsed > plan.budget_s:
            errors[dep.label] = f"not run: plan budget_s={plan.budget_s:g} exhausted after {elapsed:.0f} s"
            continue
        log.info("[%d/%d] %s", i, len(deployments), dep.label)
        print(f"[{i}/{len(deployments)}] {dep.label} (t={elapsed:.0f} s)", file=sys.stderr, flush=True)
        workdir = out / "deployments" / _slug(dep.label)
        try:
            with running(dep, workdir, plan.server) as (url, startup_s):
                run = run_bench(_bench_config(plan, dep, url), corpus, info)
        except RewardkitError as exc:
            errors[dep.label] = exc.message
            print(f"  {dep.label}: {exc.message.splitlines()[0]}", file=sys.stderr)
            continue
        run["deployment_label"] = dep.label
        run["startup_s"] = startup_s
        write_json(out / "runs" / f"{_slug(dep.label)}.json", run)
        runs[dep.label], startup[dep.label] = run, startup_s
    summary = summarize(plan, deployments, runs, startup, errors)
    summary["wall_s"] = time.perf_counter() - started
    rows = [row for label, run in runs.items() for row in report.csv_rows(run["points"], label)]
    report.write_csv(out / "results.csv", rows)
    summary["plots"] = _plots(plan, deployments, runs, summary["groups"], out / "plots")
    write_json(out / "summary.json", summary)
    write_text(out / "report.md", render_report(summary, runs))
    return summary


def _plots(
    plan: Plan,
    deployments: list[Deployment],
    runs: dict[str, dict[str, Any]],
    groups: list[dict[str, Any]],
    out: Path,
) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for dtype in plan.dtypes:
        mine = [d for d in deployments if d.dtype == dtype and d.label in runs]
        if not mine:
            continue
        series = {d.label.split("/")[0]: runs[d.label]["points"] for d in mine}
        for g in groups:
            if g["dtype"] == dtype and g["status"] == "ok" and g.get("isolation"):
                series["dedicated (isolation: slowest scorer)"] = g["points"]
        ref = max(
            runs[mine[0].label]["points"], key=lambda p: (p["batch"], p["concurrency"] or p["rate"] or 0)
        )
        ref_key = _key(ref)
        samples = {
            d.label.split("/")[0]: [v for p in runs[d.label]["points"] if _key(p) == ref_key for v in p["latency_samples_ms"]]
            for d in mine
        }  # fmt: skip
        timelines = {d.label.split("/")[0]: runs[d.label]["resource_timeline"] for d in mine}
        load = f"concurrency {ref_key[1]}" if ref_key[1] is not None else f"rate {ref_key[2]:g}/s"
        plots = [
            (f"throughput-{dtype}.png", report.plot_throughput, series, f"items/s vs concurrency ({dtype})"),
            (f"latency-cdf-{dtype}.png", report.plot_latency_cdf, samples,
             f"latency CDF at batch {ref_key[0]}, {load} ({dtype})"),
            (f"utilisation-{dtype}.png", report.plot_utilisation, timelines, f"utilisation over time ({dtype})"),
        ]  # fmt: skip
        for name, fn, data, title in plots:
            if fn(out / name, data, title):
                written.append(f"plots/{name}")
    if runs and not written:
        log.warning("matplotlib is not installed: no plots written")
    return written


def _f(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def render_report(summary: dict[str, Any], runs: dict[str, dict[str, Any]]) -> str:
    env = summary["environment"] or {}
    gpu = env.get("gpu") or {}
    lines = ["# Qualification report", ""]
    lines.append("**Result: PASS**" if summary["passed"] else "**Result: FAIL**")
    lines += [f"- {f}" for f in summary["failures"]]
    lines += [
        "",
        "## Environment",
        "",
        f"- GPU: {', '.join(gpu.get('names') or []) or 'none (' + str(gpu.get('reason')) + ')'}; "
        f"driver {gpu.get('driver', '–')}, CUDA driver {gpu.get('cuda_driver', '–')}, torch CUDA {env.get('torch_cuda')}",
        f"- python {env.get('python')}, torch {env.get('torch')}, transformers {env.get('transformers')}, "
        f"rewardkit {env.get('rewardkit')} ({env.get('git_sha')}{' dirty' if env.get('git_dirty') else ''})",
        f"- corpus: {(summary['corpus'] or {}).get('size')} distinct items, digest "
        f"`{(summary['corpus'] or {}).get('digest', '')[:16]}`; sweep: `{json.dumps(summary['sweep'])}`",
        f"- wall time: {summary.get('wall_s', 0):.0f} s",
    ]
    if summary["isolation"]:
        lines.append(
            "- **dedicated is measured by isolation**: fewer GPUs than scorers, so each scorer ran alone; "
            "its items/s is the slowest scorer's at each load point and it holds one GPU per scorer."
        )
    for dtype in summary["dtypes"]:
        groups = [g for g in summary["groups"] if g["dtype"] == dtype]
        lines += ["", f"## {dtype}", ""]
        rows = []
        for g in groups:
            if g["status"] != "ok":
                rows.append([g["group"], g["gpus_held"], "**failed**", "", "", "", "", "", "", "", ""])
                continue
            ratio = g.get("ratio_vs_dedicated") or {}
            par = "; ".join(
                f"{s}: {_f(p['max_abs_delta'], 6)}/{_f(p['p99_abs_delta'], 6)}{'' if p['pass'] else ' **FAIL**'}"
                for s, p in (g["parity"] or {}).items()
            )
            v = g["validity"]
            codes = ", ".join(f"{k}={n}" for k, n in sorted(v["item_errors_by_code"].items()))
            label = g["group"] + (" (isolation)" if g["isolation"] else "")
            rows.append(
                [
                    label,
                    g["gpus_held"],
                    _f(g["items_per_s_mean"]),
                    _f(g["items_per_s_peak"]),
                    _f(g["rewards_per_gpu_hour"], 0),
                    "1.00" if g["group"] == "dedicated" else _f(ratio.get("items_per_s"), 2),
                    "1.00" if g["group"] == "dedicated" else _f(ratio.get("rewards_per_gpu_hour"), 2),
                    f"{'/'.join(g['regimes'])} ({_f(g['gpu_util_mean'])}%)",
                    f"{v['ok']}/{v['requests']}" + (f" [{codes}]" if codes else ""),
                    par or "reference",
                    g["unstable_points"],
                ]
            )
        header = ("mode", "GPUs held", "items/s mean", "items/s peak", "rewards/GPU-h", "× ded. items/s",
                  "× ded. per GPU-h", "regime (GPU util)", "valid requests", "parity max/p99 |Δ|", "unstable pts")  # fmt: skip
        lines.append(report.markdown_table(header, rows))
        goals = summary["goals"][dtype]
        lines += ["", "Goals:", ""]
        lines.append(f"- 100% valid: {'met' if goals['all_valid'] else '**missed**'}")
        lines.append(
            f"- parity within atol {summary['atol'][dtype]:g}: {'met' if goals['parity'] else '**missed**'}"
        )
        for name, goal in goals.items():
            if isinstance(goal, dict):
                verdict = "met" if goal["met"] else f"**missed** by {goal['target'] - goal['value']:.2f}"
                lines.append(
                    f"- {name} ≥ {goal['target']}: {goal['value']:.2f} ({verdict}; "
                    f"mean over {goal['points']} {goal['basis']})"
                )
                if goal.get("equal_utilisation_ceiling") is not None:
                    times = ", ".join(f"{k} {v:.2f} ms" for k, v in goal["gpu_ms_per_item"].items())
                    lines.append(
                        f"  - at equal GPU utilisation this ratio is at most "
                        f"{goal['equal_utilisation_ceiling']:.2f} (n · max t / Σ t over the GPU-busy time"
                        f" per item of each scorer alone: {times}); above it, dedicated's GPUs were the less busy"
                    )
    lines += ["", "## Plots", ""]
    lines += [f"![{p}]({p})" for p in summary.get("plots", [])] or ["(matplotlib not installed: no plots)"]
    lines += ["", "## Every load point", ""]
    for label, run in runs.items():
        lines += [f"### {label}", "", report.point_table(run["points"], label.split("/")[0]), ""]
    return "\n".join(lines) + "\n"
