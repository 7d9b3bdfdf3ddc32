"""One benchmark run: every (batch, concurrency | rate) point against one service → run JSON.

This is what `rewardplane bench` writes and what `qualify` runs once per deployment. The JSON
layout is versioned (`SCHEMA_VERSION`) and described by `schemas/bench_run.schema.json`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

from tqdm import tqdm

from rewardplane.bench.corpus import corpus_digest
from rewardplane.bench.environment import collect_environment
from rewardplane.bench.gpu_monitor import ResourceMonitor
from rewardplane.bench.loadgen import LoadGenerator, summarize_point
from rewardplane.bench.windows import WindowPolicy
from rewardplane.core.errors import UsageError
from rewardplane.serve.protocol import DEPLOYMENT_ROUTE, SCORERS_ROUTE, ScoreItem

SCHEMA_VERSION = "rewardplane.bench_run/1"


@dataclass
class BenchConfig:
    url: str
    scorers: list[str]
    batches: list[int] = field(default_factory=lambda: [1, 4, 8])
    concurrencies: list[int] = field(default_factory=lambda: [1, 4, 16])
    rates: list[float] = field(default_factory=list)  # non-empty: open loop instead of closed
    duration_s: float = 30.0
    requests: int = 60
    warmup: int = 5
    repetitions: int = 1
    policy: WindowPolicy = field(default_factory=WindowPolicy)
    slo_ms: float | None = None
    token: str | None = None
    timeout_s: float = 60.0
    seed: int = 0
    gpu_indices: list[int] | None = None
    monitor_interval_s: float = 0.5
    mode: str | None = None  # label for reports; the service's own /v1/deployment wins
    coverage_pass: bool = False  # score every corpus item once before the sweep (parity needs all)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("token")  # never write a credential into a result file
        out["loop"] = "open" if self.rates else "closed"
        return out


def load_schema() -> dict[str, Any]:
    text = resources.files("rewardplane").joinpath("schemas", "bench_run.schema.json").read_text()
    return json.loads(text)


async def _run(config: BenchConfig, corpus: list[ScoreItem], corpus_info: dict[str, Any]) -> dict[str, Any]:
    gen = LoadGenerator(
        config.url,
        config.scorers,
        corpus,
        token=config.token,
        timeout_s=config.timeout_s,
        policy=config.policy,
    )
    async with gen.client(4) as client:
        served = await gen.get_json(client, SCORERS_ROUTE)
        deployment = await gen.get_json(client, DEPLOYMENT_ROUTE)
    if served is None:
        raise UsageError(f"cannot reach {config.url}/v1/scorers (is the service up, is the token right?)")
    monitor = ResourceMonitor(config.monitor_interval_s, config.gpu_indices)
    environment = collect_environment(monitor.gpu_info(), deployment)
    mode = environment["deployment_mode"] or config.mode
    loop = "open" if config.rates else "closed"
    loads: list[float] = list(config.rates) if config.rates else [float(c) for c in config.concurrencies]
    grid = [(b, load) for b in config.batches for load in loads]
    coverage = await gen.coverage_pass(max(config.batches)) if config.coverage_pass else None
    points = []
    origin = time.perf_counter()
    with monitor, tqdm(total=len(grid) * config.repetitions, desc="bench", unit="point", leave=False) as bar:
        for batch, load in grid:
            measurements = []
            for rep in range(config.repetitions):
                if loop == "closed":
                    m = await gen.closed_loop(batch, int(load), config.requests, config.warmup)
                else:
                    seed = config.seed * 1_000_003 + rep
                    m = await gen.open_loop(batch, load, config.duration_s, config.warmup, seed)
                measurements.append(m)
                bar.update()
            point = summarize_point(
                measurements,
                loop=loop,
                n_scorers=len(config.scorers),
                policy=config.policy,
                slo_ms=config.slo_ms,
                monitor=monitor,
                origin=origin,
            )
            head = {
                "mode": mode,
                "scorers": list(config.scorers),
                "loop": loop,
                "batch": batch,
                "concurrency": int(load) if loop == "closed" else None,
                "rate": load if loop == "open" else None,
                "repetitions": config.repetitions,
                "slo_ms": config.slo_ms,
            }
            points.append({**head, **point})
    counted = [p["requests"] for p in points] + ([coverage] if coverage else [])
    failures: dict[str, int] = {}
    for requests in counted:
        for reason, count in requests["failures_by_reason"].items():
            failures[reason] = failures.get(reason, 0) + count
    regimes = sorted({p["regime"] for p in points})
    return {
        "schema_version": SCHEMA_VERSION,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "url": config.url,
        "mode": mode,
        "config": config.to_json(),
        "served_scorers": served,
        "corpus": {**corpus_info, "size": len(corpus), "digest": corpus_digest(corpus)},
        "environment": environment,
        "coverage": coverage,
        "points": points,
        "totals": {
            "requests": sum(r["total"] for r in counted),
            "ok": sum(r["ok"] for r in counted),
            "failed": sum(r["failed"] for r in counted),
            "failures_by_reason": dict(sorted(failures.items())),
            "item_errors_by_code": dict(sorted(gen.item_errors.items())),
            "items_per_s_max": max((p["items_per_s"] for p in points), default=0.0),
            "regimes": regimes,
            "unstable_points": sum(not p["stable"] for p in points),
        },
        "scores": gen.book.scores,
        "score_spread": gen.book.spread,
        "resource_timeline": monitor.timeline(origin),
    }


def run_bench(config: BenchConfig, corpus: list[ScoreItem], corpus_info: dict[str, Any]) -> dict[str, Any]:
    for batch in config.batches:
        if batch < 1:
            raise UsageError(f"batch sizes must be >= 1, got {batch}")
    if not config.scorers:
        raise UsageError("--scorers must name at least one scorer")
    return asyncio.run(_run(config, corpus, corpus_info))
