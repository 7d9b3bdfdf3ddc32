"""One benchmark run: every (batch, concurrency | rate) point against one service → run JSON.

This is what `rewardplane bench` writes and what `qualify` runs once per deployment. The JSON
layout is versioned (`SCHEMA_VERSION`) and described by `schemas/bench_run.schema.json`.

`Sweep` is the one definition of the load (batch sizes, concurrencies, requests, measurement
windows, corpus) and its defaults: `rewardplane bench` builds one from its flags, a qualify plan
holds one under `sweep:`, and the benchmarks that sweep read their defaults from it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator
from tqdm import tqdm

from rewardplane.bench.corpus import corpus_digest
from rewardplane.bench.environment import collect_environment
from rewardplane.bench.gpu_monitor import ResourceMonitor
from rewardplane.bench.loadgen import LoadGenerator, summarize_point
from rewardplane.bench.windows import WindowPolicy
from rewardplane.core.config import ConfigModel, FieldError
from rewardplane.core.errors import UsageError
from rewardplane.serve.protocol import DEPLOYMENT_ROUTE, SCORERS_ROUTE, ScoreItem

SCHEMA_VERSION = "rewardplane.bench_run/1"


class Sweep(ConfigModel):
    """The load a benchmark run puts on a service: `rewardplane bench`'s flags, a qualify plan's
    `sweep:` (docs/qualify.md). Batch sizes 1, 8, 32 by default: 1 is the latency floor, 8 a
    GRPO group (TRL's default `num_generations`), 32 several groups in one request."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    batch: list[int] = Field(default_factory=lambda: [1, 8, 32], min_length=1)
    """Items per request."""
    concurrency: list[int] = Field(default_factory=lambda: [1, 4, 16], min_length=1)
    """Closed loop: clients, each waiting for its reply before sending the next request."""
    requests: int = Field(60, ge=1)
    """The fewest measured requests per client."""
    warmup: int = Field(5, ge=0)
    """Warm-up requests per client, validated but left out of the statistics."""
    repetitions: int = Field(1, ge=1)
    """Measurements per point, pooled."""
    window_s: float = Field(WindowPolicy.window_s, gt=0)
    """The measurement window, seconds."""
    stable_windows: int = Field(WindowPolicy.stable_windows, ge=1)
    """Consecutive windows that must agree for a point to be stable."""
    tolerance: float = Field(WindowPolicy.tolerance, ge=0)
    """How far the agreeing windows' throughput and p95 may differ (max/min - 1)."""
    max_windows: int = Field(WindowPolicy.max_windows, ge=1)
    """Windows before a point that never settles is reported unstable."""
    slo_ms: float | None = Field(None, gt=0)
    """The latency target for goodput; null: none."""
    corpus_size: int = Field(256, ge=1)
    """Items in the generated corpus."""
    seed: int = 0
    """The corpus and arrival seed."""
    images: bool = True
    """A generated corpus with images (false: text only)."""
    timeout_s: float = Field(60.0, gt=0)
    """Per-request timeout; a timeout is a failed request (`timeout`)."""

    @field_validator("batch", "concurrency")
    @classmethod
    def _positive(cls, values: list[int]) -> list[int]:
        if min(values) < 1:
            raise ValueError(f"must be positive integers, got {values}")
        return values

    @model_validator(mode="after")
    def _windows(self) -> Sweep:
        if self.stable_windows > self.max_windows:
            raise FieldError(
                "stable_windows", f"must be <= max_windows ({self.max_windows}), got {self.stable_windows}"
            )
        return self

    @property
    def policy(self) -> WindowPolicy:
        return WindowPolicy(self.window_s, self.stable_windows, self.tolerance, self.max_windows)


OPEN_LOOP_DURATION_S = 30.0
"""Open loop: seconds per arrival rate (`rewardplane bench --duration`)."""


@dataclass
class BenchConfig:
    url: str
    scorers: list[str]
    sweep: Sweep = field(default_factory=Sweep)
    rates: list[float] = field(default_factory=list)  # non-empty: open loop instead of closed
    duration_s: float = OPEN_LOOP_DURATION_S
    token: str | None = None
    gpu_indices: list[int] | None = None
    monitor_interval_s: float = 0.5
    mode: str | None = None  # label for reports; the service's own /v1/deployment wins
    coverage_pass: bool = False  # score every corpus item once before the sweep (parity needs all)

    def to_json(self) -> dict[str, Any]:
        """The run file's `config` (schemas/bench_run.schema.json); never the token."""
        s = self.sweep
        return {
            "url": self.url,
            "scorers": list(self.scorers),
            "batches": list(s.batch),
            "concurrencies": list(s.concurrency),
            "rates": list(self.rates),
            "duration_s": self.duration_s,
            "requests": s.requests,
            "warmup": s.warmup,
            "repetitions": s.repetitions,
            "policy": asdict(s.policy),
            "slo_ms": s.slo_ms,
            "timeout_s": s.timeout_s,
            "seed": s.seed,
            "gpu_indices": self.gpu_indices,
            "monitor_interval_s": self.monitor_interval_s,
            "mode": self.mode,
            "coverage_pass": self.coverage_pass,
            "loop": "open" if self.rates else "closed",
        }


def load_schema() -> dict[str, Any]:
    text = resources.files("rewardplane").joinpath("schemas", "bench_run.schema.json").read_text()
    return json.loads(text)


async def _repetitions(
    gen: LoadGenerator, config: BenchConfig, loop: str, batch: int, load: float, bar
) -> list:
    """One load point's measurements, one per repetition (an open loop's arrivals seeded per repetition)."""
    sweep = config.sweep
    measurements = []
    for rep in range(sweep.repetitions):
        if loop == "closed":
            m = await gen.closed_loop(batch, int(load), sweep.requests, sweep.warmup)
        else:
            seed = sweep.seed * 1_000_003 + rep
            m = await gen.open_loop(batch, load, config.duration_s, sweep.warmup, seed)
        measurements.append(m)
        bar.update()
    return measurements


def _totals(
    points: list[dict[str, Any]], coverage: dict[str, Any] | None, item_errors: dict
) -> dict[str, Any]:
    """The run's totals over every point (and the coverage pass): requests, failures, the best rate."""
    counted = [p["requests"] for p in points] + ([coverage] if coverage else [])
    failures: dict[str, int] = {}
    for requests in counted:
        for reason, count in requests["failures_by_reason"].items():
            failures[reason] = failures.get(reason, 0) + count
    return {
        "requests": sum(r["total"] for r in counted),
        "ok": sum(r["ok"] for r in counted),
        "failed": sum(r["failed"] for r in counted),
        "failures_by_reason": dict(sorted(failures.items())),
        "item_errors_by_code": dict(sorted(item_errors.items())),
        "items_per_s_max": max((p["items_per_s"] for p in points), default=0.0),
        "regimes": sorted({p["regime"] for p in points}),
        "unstable_points": sum(not p["stable"] for p in points),
    }


async def _run(config: BenchConfig, corpus: list[ScoreItem], corpus_info: dict[str, Any]) -> dict[str, Any]:
    gen = LoadGenerator(
        config.url,
        config.scorers,
        corpus,
        token=config.token,
        timeout_s=config.sweep.timeout_s,
        policy=config.sweep.policy,
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
    sweep = config.sweep
    loads: list[float] = list(config.rates) if config.rates else [float(c) for c in sweep.concurrency]
    grid = [(b, load) for b in sweep.batch for load in loads]
    coverage = await gen.coverage_pass(max(sweep.batch)) if config.coverage_pass else None
    points = []
    origin = time.perf_counter()
    with monitor, tqdm(total=len(grid) * sweep.repetitions, desc="bench", unit="point", leave=False) as bar:
        for batch, load in grid:
            measurements = await _repetitions(gen, config, loop, batch, load, bar)
            point = summarize_point(
                measurements,
                loop=loop,
                n_scorers=len(config.scorers),
                policy=sweep.policy,
                slo_ms=sweep.slo_ms,
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
                "repetitions": sweep.repetitions,
                "slo_ms": sweep.slo_ms,
            }
            points.append({**head, **point})
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
        "totals": _totals(points, coverage, gen.item_errors),
        "scores": gen.book.scores,
        "score_spread": gen.book.spread,
        "resource_timeline": monitor.timeline(origin),
    }


def run_bench(config: BenchConfig, corpus: list[ScoreItem], corpus_info: dict[str, Any]) -> dict[str, Any]:
    if not config.scorers:
        raise UsageError("--scorers must name at least one scorer")
    return asyncio.run(_run(config, corpus, corpus_info))
