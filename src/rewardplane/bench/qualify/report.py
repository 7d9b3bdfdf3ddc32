"""`report.md` and the plots of a qualification, rendered from `summary.json` and the runs.

The tables and plots of a single bench run live in bench/report.py; this adds what only a
comparison across modes has: one table per dtype, the goals with their shortfalls and the
equal-utilisation ceiling, and one series per mode in every plot.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from rewardplane.bench import report as bench_report
from rewardplane.bench.qualify.plan import Deployment, Plan
from rewardplane.bench.qualify.summary import point_key

log = logging.getLogger(__name__)


def write_plots(
    plan: Plan,
    deployments: list[Deployment],
    runs: dict[str, dict[str, Any]],
    groups: list[dict[str, Any]],
    out: Path,
) -> list[str]:
    """Three plots per dtype (throughput, latency CDF, utilisation); the paths written, relative to
    the output directory. None without matplotlib, which is logged, and the report says so."""
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
        ref_key = point_key(ref)
        samples = {
            d.label.split("/")[0]: [v for p in runs[d.label]["points"] if point_key(p) == ref_key for v in p["latency_samples_ms"]]
            for d in mine
        }  # fmt: skip
        timelines = {d.label.split("/")[0]: runs[d.label]["resource_timeline"] for d in mine}
        load = f"concurrency {ref_key[1]}" if ref_key[1] is not None else f"rate {ref_key[2]:g}/s"
        plots = [
            (f"throughput-{dtype}.png", bench_report.plot_throughput, series, f"items/s vs concurrency ({dtype})"),
            (f"latency-cdf-{dtype}.png", bench_report.plot_latency_cdf, samples,
             f"latency CDF at batch {ref_key[0]}, {load} ({dtype})"),
            (f"utilisation-{dtype}.png", bench_report.plot_utilisation, timelines, f"utilisation over time ({dtype})"),
        ]  # fmt: skip
        for name, fn, data, title in plots:
            if fn(out / name, data, title):
                written.append(f"plots/{name}")
    if runs and not written:
        log.warning("matplotlib is not installed: no plots written")
    return written


def _f(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


_HEADER = ("mode", "GPUs held", "items/s mean", "items/s peak", "rewards/GPU-h", "× ded. items/s",
           "× ded. per GPU-h", "regime (GPU util)", "valid requests", "parity max/p99 |Δ|", "unstable pts")  # fmt: skip


def _environment(summary: dict[str, Any]) -> list[str]:
    env = summary["environment"] or {}
    gpu = env.get("gpu") or {}
    corpus = summary["corpus"] or {}
    lines = [
        "## Environment",
        "",
        f"- GPU: {', '.join(gpu.get('names') or []) or 'none (' + str(gpu.get('reason')) + ')'}; "
        f"driver {gpu.get('driver', '–')}, CUDA driver {gpu.get('cuda_driver', '–')}, torch CUDA {env.get('torch_cuda')}",
        f"- python {env.get('python')}, torch {env.get('torch')}, transformers {env.get('transformers')}, "
        f"rewardplane {env.get('rewardplane')} ({env.get('git_sha')}{' dirty' if env.get('git_dirty') else ''})",
        f"- corpus: {corpus.get('size')} distinct items, digest "
        f"`{corpus.get('digest', '')[:16]}`; sweep: `{json.dumps(summary['sweep'])}`",
        f"- wall time: {summary.get('wall_s', 0):.0f} s",
    ]
    if summary["isolation"]:
        lines.append(
            "- **dedicated is measured by isolation**: fewer GPUs than scorers, so each scorer ran alone; "
            "its items/s is the slowest scorer's at each load point and it holds one GPU per scorer."
        )
    return lines


def _row(g: dict[str, Any]) -> list[Any]:
    if g["status"] != "ok":
        return [g["group"], g["gpus_held"], "**failed**", "", "", "", "", "", "", "", ""]
    ratio = g.get("ratio_vs_dedicated") or {}
    par = "; ".join(
        f"{s}: {_f(p['max_abs_delta'], 6)}/{_f(p['p99_abs_delta'], 6)}{'' if p['pass'] else ' **FAIL**'}"
        for s, p in (g["parity"] or {}).items()
    )
    v = g["validity"]
    codes = ", ".join(f"{k}={n}" for k, n in sorted(v["item_errors_by_code"].items()))
    reference = g["group"] == "dedicated"
    return [
        g["group"] + (" (isolation)" if g["isolation"] else ""),
        g["gpus_held"],
        _f(g["items_per_s_mean"]),
        _f(g["items_per_s_peak"]),
        _f(g["rewards_per_gpu_hour"], 0),
        "1.00" if reference else _f(ratio.get("items_per_s"), 2),
        "1.00" if reference else _f(ratio.get("rewards_per_gpu_hour"), 2),
        f"{'/'.join(g['regimes'])} ({_f(g['gpu_util_mean'])}%)",
        f"{v['ok']}/{v['requests']}" + (f" [{codes}]" if codes else ""),
        par or "reference",
        g["unstable_points"],
    ]


def _goal_lines(goals: dict[str, Any], atol: float) -> list[str]:
    lines = ["", "Goals:", ""]
    lines.append(f"- 100% valid: {'met' if goals['all_valid'] else '**missed**'}")
    lines.append(f"- parity within atol {atol:g}: {'met' if goals['parity'] else '**missed**'}")
    for name, goal in goals.items():
        if not isinstance(goal, dict):
            continue
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
    return lines


def render_report(summary: dict[str, Any], runs: dict[str, dict[str, Any]]) -> str:
    """`report.md`: the result and its failures, the environment, per dtype a table and the goals,
    the plots, and every load point of every run."""
    lines = ["# Qualification report", ""]
    lines.append("**Result: PASS**" if summary["passed"] else "**Result: FAIL**")
    lines += [f"- {f}" for f in summary["failures"]]
    lines += ["", *_environment(summary)]
    for dtype in summary["dtypes"]:
        rows = [_row(g) for g in summary["groups"] if g["dtype"] == dtype]
        lines += ["", f"## {dtype}", "", bench_report.markdown_table(_HEADER, rows)]
        lines += _goal_lines(summary["goals"][dtype], summary["atol"][dtype])
    lines += ["", "## Plots", ""]
    lines += [f"![{p}]({p})" for p in summary.get("plots", [])] or ["(matplotlib not installed: no plots)"]
    lines += ["", "## Every load point", ""]
    for label, run in runs.items():
        lines += [f"### {label}", "", bench_report.point_table(run["points"], label.split("/")[0]), ""]
    return "\n".join(lines) + "\n"
