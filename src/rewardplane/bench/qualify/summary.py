"""From the runs of a plan to `summary.json`: per mode validity, throughput, rewards per GPU-hour,
parity against dedicated, and the plan's goals with the equal-utilisation ceiling.

Dedicated by isolation (fewer GPUs than scorers) is one group of several runs: at each load
point its items/s is the slowest scorer's (every item needs every scorer) and its p95 the
worst, and it holds one GPU per scorer. Rewards per GPU-hour = items/s × 3600 / GPUs held.
Parity compares every item's score with the dedicated run's, per scorer, within the plan's
atol for the dtype; a delta no larger than dedicated's own `score_spread` is batch composition.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rewardplane.bench.qualify.plan import Deployment, Goals, Plan

SUMMARY_VERSION = "rewardplane.qualify_summary/1"


def point_key(point: dict[str, Any]) -> tuple[int, int | None, float | None]:
    """(batch, concurrency, rate): what identifies a load point across runs."""
    return point["batch"], point["concurrency"], point["rate"]


def _combine_isolation(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per load point, the dedicated layout's view: slowest scorer's items/s, worst latencies."""
    by_key: dict[Any, list[dict[str, Any]]] = {}
    for run in runs:
        for p in run["points"]:
            by_key.setdefault(point_key(p), []).append(p)
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
    pa = {point_key(p): p for p in a["points"]}
    pb = {point_key(p): p for p in b["points"]}
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


def evaluate_goals(groups: list[dict[str, Any]], dtype: str, targets: Goals) -> dict[str, Any]:
    """Every goal of one dtype, measured: 100 % valid, parity, and the plan's two ratio targets.
    A ratio goal is absent when either side failed or measured nothing."""
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
            goal = _compare(g, shared, targets.mps_vs_shared_items_per_s, per_gpu=False)
            if goal is not None:
                goals[f"{g['group']}_vs_shared_items_per_s"] = goal
    if consolidated is not None and dedicated is not None:
        goal = _compare(consolidated, dedicated, targets.consolidated_vs_dedicated_per_gpu_hour, per_gpu=True)
        if goal is not None:
            if dedicated.get("gpu_ms_per_item"):
                goal["equal_utilisation_ceiling"] = equal_utilisation_ceiling(dedicated["gpu_ms_per_item"])
                goal["gpu_ms_per_item"] = dedicated["gpu_ms_per_item"]
            goals["consolidated_vs_dedicated_per_gpu_hour"] = goal
    return goals


def _groups_of(dtype: str, deployments: list[Deployment], runs: dict[str, dict[str, Any]],
               startup: dict[str, float], errors: dict[str, str]) -> list[dict[str, Any]]:  # fmt: skip
    """One record per mode label of `dtype`, in run order; a failed deployment fails its group."""
    order: list[str] = []
    for d in deployments:
        if d.dtype == dtype and d.group not in order:
            order.append(d.group)
    groups = []
    for group in order:
        deps = [d for d in deployments if d.dtype == dtype and d.group == group]
        failed = [errors[d.label] for d in deps if d.label in errors]
        if failed:
            groups.append({"group": group, "mode": deps[0].mode, "dtype": dtype, "status": "failed",
                           "error": "; ".join(failed), "deployments": [d.label for d in deps],
                           "gpus_held": deps[0].gpus_held, "parity": None})  # fmt: skip
            continue
        groups.append(_group_record(deps, [runs[d.label] for d in deps], [startup[d.label] for d in deps]))
    return groups


def _add_parity(groups: list[dict[str, Any]], runs: dict[str, dict[str, Any]], scorers: list[str],
                atol: float) -> None:  # fmt: skip
    """Parity and ratios of every ok group of one dtype against its dedicated group, in place."""
    reference = next((g for g in groups if g["group"] == "dedicated"), None)
    ref_ok = reference is not None and reference["status"] == "ok"
    ref_scores: dict[str, dict[str, float]] = {}
    ref_spread: dict[str, float] = {}
    if ref_ok:
        for label in reference["deployments"]:
            for item_id, scores in runs[label]["scores"].items():
                ref_scores.setdefault(item_id, {}).update(scores)
            ref_spread.update(runs[label]["score_spread"])
    for g in groups:
        if g["status"] != "ok":
            continue
        g["parity"] = None
        g["ratio_vs_dedicated"] = None
        if g["group"] == "dedicated" or not ref_ok:
            continue
        (label,) = g["deployments"]
        g["parity"] = parity(ref_scores, runs[label]["scores"], scorers, atol, ref_spread)
        g["ratio_vs_dedicated"] = {
            "items_per_s": g["items_per_s_mean"] / reference["items_per_s_mean"]
            if reference["items_per_s_mean"]
            else None,
            "rewards_per_gpu_hour": g["rewards_per_gpu_hour"] / reference["rewards_per_gpu_hour"]
            if reference["rewards_per_gpu_hour"]
            else None,
        }


def failures_of(groups: list[dict[str, Any]]) -> list[str]:
    """One line per reason the run fails: a deployment that did not run, invalid requests, parity."""
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
    return failures


def summarize(plan: Plan, deployments: list[Deployment], runs: dict[str, dict[str, Any]],
              startup: dict[str, float], errors: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    """`summary.json` (schema `SUMMARY_VERSION`) from every deployment's run, start-up or error."""
    groups: list[dict[str, Any]] = []
    names = plan.scorer_names
    for dtype in plan.dtypes:
        mine = _groups_of(dtype, deployments, runs, startup, errors)
        _add_parity(mine, runs, names, plan.atol[dtype])
        groups += mine
    failures = failures_of(groups)
    first_run = next(iter(runs.values()), None)
    return {
        "schema_version": SUMMARY_VERSION,
        "isolation": plan.isolation,
        "gpus": plan.gpus,
        "scorers": plan.scorers,
        "dtypes": plan.dtypes,
        "sweep": plan.sweep.model_dump(),
        "atol": plan.atol,
        "environment": first_run["environment"] if first_run else None,
        "corpus": first_run["corpus"] if first_run else None,
        "groups": groups,
        "goals": {dtype: evaluate_goals(groups, dtype, plan.goals) for dtype in plan.dtypes},
        "failures": failures,
        "passed": not failures,
    }
