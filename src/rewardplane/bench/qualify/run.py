"""Running a plan: each deployment's server up (bench/server.py), its sweep with GPU sampling
(bench/sweep.py, bench/gpu_monitor.py), its run JSON and scores kept for parity, server down.
Then the summary, the CSV, the plots and the report, written once at the end.

Every deployment uses the same corpus, and every sweep begins with a coverage pass that scores
each corpus item once, so parity compares the whole corpus and not only the items the busiest
load point happened to reach. A deployment that fails to start is recorded with its log tail
and the next one starts; `budget_s` stops new deployments from starting (the first always runs).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rewardplane.bench import report as bench_report
from rewardplane.bench.corpus import generate_corpus, load_inputs
from rewardplane.bench.qualify.plan import Deployment, Plan, estimate_s, expand
from rewardplane.bench.qualify.report import render_report, write_plots
from rewardplane.bench.qualify.summary import summarize
from rewardplane.bench.server import running_server
from rewardplane.bench.sweep import BenchConfig, run_bench
from rewardplane.core.atomic import write_json, write_text
from rewardplane.core.errors import RewardplaneError
from rewardplane.serve.protocol import ScoreItem

log = logging.getLogger(__name__)


@dataclass
class Results:
    """What the deployments produced, by deployment label: run JSON, start-up seconds, or an error."""

    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    startup: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def slug(label: str) -> str:
    """A deployment label as a file name: "dedicated:clip_h/fp16" -> "dedicated-clip_h-fp16"."""
    return label.replace("/", "-").replace(":", "-")


def _write_deploy_file(dep: Deployment, workdir: Path) -> Path:
    path = workdir / "deploy.yaml"
    write_text(path, yaml.safe_dump(dep.doc, sort_keys=False))
    return path


def bench_config(plan: Plan, dep: Deployment, url: str) -> BenchConfig:
    return BenchConfig(
        url=url,
        scorers=dep.scorers,
        sweep=plan.sweep,
        token=plan.server.token or os.environ.get("REWARDPLANE_TOKEN"),
        gpu_indices=[g for g in plan.gpus[: dep.gpus_held]] or None,  # what the sampler watches
        mode=dep.group,
        coverage_pass=True,  # parity needs every corpus item scored
    )


def _corpus(plan: Plan) -> tuple[list[ScoreItem], dict[str, Any]]:
    s = plan.sweep
    if plan.inputs:
        return load_inputs(plan.inputs), {"source": str(plan.inputs)}
    corpus = generate_corpus(s.corpus_size, seed=s.seed, images=s.images)
    return corpus, {"source": "generated", "seed": s.seed, "images": s.images}


def run_deployment(plan: Plan, dep: Deployment, workdir: Path, corpus: list[ScoreItem],
                   info: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """Start `dep` (bench/server.py), run the sweep against it, stop it; the run JSON with
    `deployment_label` and `startup_s` added. A server that fails to start raises ServerStartError."""
    server = plan.server
    started = time.perf_counter()
    with running_server(
        [],
        workdir,
        command=server.command,
        fields={"deploy": str(_write_deploy_file(dep, workdir))},
        env={k: str(v) for k, v in server.env.items()},
        ready_timeout_s=server.ready_timeout_s,
        stop_timeout_s=server.stop_timeout_s,
        label=dep.label,
    ) as url:
        startup_s = time.perf_counter() - started
        run = run_bench(bench_config(plan, dep, url), corpus, info)
    run["deployment_label"] = dep.label
    run["startup_s"] = startup_s
    return run


def run_all(plan: Plan, deployments: list[Deployment], out: Path) -> Results:
    """Every deployment in order, each run JSON written to `out/runs/` as soon as it exists."""
    corpus, info = _corpus(plan)
    results = Results()
    started = time.perf_counter()
    for i, dep in enumerate(deployments, 1):
        elapsed = time.perf_counter() - started
        if i > 1 and plan.budget_s is not None and elapsed > plan.budget_s:
            results.errors[dep.label] = (
                f"not run: plan budget_s={plan.budget_s:g} exhausted after {elapsed:.0f} s"
            )
            continue
        log.info("[%d/%d] %s", i, len(deployments), dep.label)
        print(f"[{i}/{len(deployments)}] {dep.label} (t={elapsed:.0f} s)", file=sys.stderr, flush=True)
        try:
            run = run_deployment(plan, dep, out / "deployments" / slug(dep.label), corpus, info)
        except RewardplaneError as exc:
            results.errors[dep.label] = exc.message
            print(f"  {dep.label}: {exc.message}", file=sys.stderr)
            continue
        write_json(out / "runs" / f"{slug(dep.label)}.json", run)
        results.runs[dep.label], results.startup[dep.label] = run, run["startup_s"]
    return results


def qualify(plan: Plan, out: Path) -> dict[str, Any]:
    """Run every deployment of the plan, write runs/, summary.json, results.csv, report.md, plots."""
    deployments = expand(plan)
    started = time.perf_counter()
    results = run_all(plan, deployments, out)
    summary = summarize(plan, deployments, results.runs, results.startup, results.errors)
    summary["wall_s"] = time.perf_counter() - started
    rows = [row for label, run in results.runs.items() for row in bench_report.csv_rows(run["points"], label)]
    bench_report.write_csv(out / "results.csv", rows)
    summary["plots"] = write_plots(plan, deployments, results.runs, summary["groups"], out / "plots")
    write_json(out / "summary.json", summary)
    write_text(out / "report.md", render_report(summary, results.runs))
    return summary


def dry_run(plan: Plan, out: Path) -> str:
    """Write every deploy file, list the deployments with an estimate; start nothing."""
    deployments = expand(plan)
    lines = []
    for dep in deployments:
        path = _write_deploy_file(dep, out / "deployments" / slug(dep.label))
        lines.append(f"{dep.label:36s} scorers={','.join(dep.scorers):24s} gpus_held={dep.gpus_held}  {path}")
    low, high = estimate_s(plan)
    lines.append(
        f"{len(deployments)} deployments; measurement {low:.0f}-{high:.0f} s plus start-up/warm-up per deployment"
        + ("" if not plan.isolation else "; dedicated measured by isolation (fewer GPUs than scorers)")
    )
    return "\n".join(lines)
