"""The load generator: closed and open loop against `POST /v1/score`, with strict validity.

Closed loop: `concurrency` clients each send a request, wait for it, send the next. Warm-up
requests are sent first and excluded; measurement runs in windows until the stability rule
holds and every client has sent `--requests` measured requests (or `max_windows` is hit).

Open loop: arrivals are Poisson at `rate` requests/s for `duration_s`, sent at their
scheduled times whether or not earlier requests have returned, and latency is measured from
the *scheduled* send time. A closed-loop client that stalls stops offering load, which hides
the queueing delay real arrivals would see ("coordinated omission"); scheduling from a fixed
timetable does not.

A request counts as ok only if the HTTP call succeeded and every requested id came back once,
in order, with a finite number for every requested scorer. Everything else is a failure with
a reason (see `REASONS`), because a failure must never be mistaken for a reward.

`timed_closed_loop` is the same closed loop without windows or validation, over any async call
(an HTTP request, or a `ScoringBackend` called directly): the benchmarks/ scripts compare
transports and hops with it. Request bodies and timing headers come from
`rewardplane.serve.protocol`, like every other speaker of the wire format.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import httpx
import numpy as np

from rewardplane.bench.gpu_monitor import ResourceMonitor
from rewardplane.bench.windows import Window, WindowPolicy, is_stable, make_window
from rewardplane.core.errors import UsageError
from rewardplane.serve.protocol import (
    INFERENCE_TIME_HEADER,
    METRICS_ROUTE,
    QUEUE_TIME_HEADER,
    RESPONSE_PROBLEMS,
    SCORE_ROUTE,
    TOTAL_TIME_HEADER,
    ScoreItem,
    decode_score_response,
    header_ms,
    item_to_wire,
    join_score_request,
)

REASONS = {
    "timeout": "the request did not complete within --timeout-s",
    "transport": "connection refused/reset or another transport error",
    "http_<status>": "a non-200 response (e.g. http_503)",
    **RESPONSE_PROBLEMS,
    "scorer_error": "the service reported a per-item error (counted by code in item_errors)",
}
MAX_LATENCY_SAMPLES = 5000
_RETRY_PAUSE_S = 0.1


@dataclass
class RequestRecord:
    scheduled: float
    end: float
    items: int
    ok: bool
    reasons: tuple[str, ...]
    phase: str  # "coverage" | "warmup" | "measure"
    queue_ms: float | None = None
    inference_ms: float | None = None
    total_ms: float | None = None

    @property
    def latency_ms(self) -> float:
        return (self.end - self.scheduled) * 1000.0


@dataclass
class ScoreBook:
    """Every valid score, per item id and scorer: the first value seen and the largest
    deviation of any later value from it (the same item scored in different batches)."""

    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    spread: dict[str, float] = field(default_factory=dict)

    def add(self, item_id: str, scorer: str, value: float) -> None:
        per_item = self.scores.setdefault(item_id, {})
        if scorer in per_item:
            delta = abs(value - per_item[scorer])
            self.spread[scorer] = max(self.spread.get(scorer, 0.0), delta)
        else:
            per_item[scorer] = value
            self.spread.setdefault(scorer, 0.0)


def validate_response(
    status: int, body: bytes, ids: Sequence[str], scorers: Sequence[str]
) -> tuple[list[str], dict[str, dict[str, float]], Counter[str]]:
    """(failure reasons, valid scores by id and scorer, per-item error codes) of one response,
    decoded as the client decodes it (`rewardplane.serve.protocol.decode_score_response`)."""
    item_errors: Counter[str] = Counter()
    if status != 200:
        return [f"http_{status}"], {}, item_errors
    decoded = decode_score_response(body, ids, scorers)
    reasons = set(decoded.problems)
    valid: dict[str, dict[str, float]] = {}
    for result in decoded.results:
        if result.scores:
            valid[result.id] = result.scores
        for scorer in scorers:
            if scorer not in result.scores and scorer in result.errors:
                reasons.add("scorer_error")
                item_errors[result.errors[scorer]["code"]] += 1
    return sorted(reasons), valid, item_errors


class RequestFactory:
    """Request bodies over the corpus in a fixed order, pre-encoded so the client stays cheap."""

    def __init__(self, corpus: Sequence[ScoreItem], scorers: Sequence[str], batch: int) -> None:
        if batch > len(corpus):
            raise UsageError(f"batch {batch} is larger than the corpus ({len(corpus)} items)")
        self._ids = [item.id for item in corpus]
        self._encoded = [json.dumps(item_to_wire(item)).encode() for item in corpus]
        self._scorers = list(scorers)
        self.batch = batch
        self._next = 0

    def next(self) -> tuple[bytes, list[str]]:
        n = len(self._ids)
        picks = [(self._next + j) % n for j in range(self.batch)]
        self._next = (self._next + self.batch) % n
        body = join_score_request(self._scorers, (self._encoded[i] for i in picks))
        return body, [self._ids[i] for i in picks]


@dataclass
class Measurement:
    """One repetition of one load point."""

    records: list[RequestRecord]
    windows: list[Window]
    start: float
    stop: float
    stable: bool
    min_requests_met: bool
    batch_sizes: dict[str, float] | None


class LoadGenerator:
    """Sends scored requests to one service and keeps every valid score in `book`."""

    def __init__(
        self,
        url: str,
        scorers: Sequence[str],
        corpus: Sequence[ScoreItem],
        *,
        token: str | None = None,
        timeout_s: float = 60.0,
        policy: WindowPolicy | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.scorers = list(scorers)
        self.corpus = list(corpus)
        self.timeout_s = timeout_s
        self.policy = policy or WindowPolicy()
        self.headers = {"content-type": "application/json"}
        if token:
            self.headers["authorization"] = f"Bearer {token}"
        self.book = ScoreBook()
        self.item_errors: Counter[str] = Counter()

    def client(self, connections: int | None) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        return httpx.AsyncClient(headers=self.headers, timeout=self.timeout_s, limits=limits)

    async def _get(self, client: httpx.AsyncClient, path: str) -> httpx.Response | None:
        """A 200 response to GET `path`; None when the service does not offer it or is unreachable."""
        try:
            response = await client.get(self.url + path)
        except httpx.HTTPError:
            return None
        return response if response.status_code == 200 else None

    async def get_json(self, client: httpx.AsyncClient, path: str) -> Any | None:
        """GET a JSON endpoint; None when the service does not offer it (404) or is unreachable."""
        response = await self._get(client, path)
        return None if response is None else response.json()

    async def scrape_batch_sizes(self, client: httpx.AsyncClient) -> dict[str, tuple[float, float]] | None:
        """(sum, count) of every batch-size histogram series on /metrics, keyed by its labels."""
        try:
            from prometheus_client.parser import text_string_to_metric_families
        except ImportError:
            return None
        if (response := await self._get(client, METRICS_ROUTE)) is None:
            return None
        out: dict[str, list[float]] = {}
        for family in text_string_to_metric_families(response.text):
            if family.type != "histogram" or "batch_size" not in family.name:
                continue
            for sample in family.samples:
                labels = {k: v for k, v in sample.labels.items() if k != "le"}
                key = labels.get("scorer") or ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "all"
                slot = out.setdefault(key, [0.0, 0.0])
                if sample.name.endswith("_sum"):
                    slot[0] += sample.value
                elif sample.name.endswith("_count"):
                    slot[1] += sample.value
        return {k: (v[0], v[1]) for k, v in out.items()}

    async def send(
        self, client: httpx.AsyncClient, body: bytes, ids: list[str], scheduled: float, phase: str
    ) -> RequestRecord:
        try:
            response = await client.post(self.url + SCORE_ROUTE, content=body)
        except httpx.TimeoutException:
            return RequestRecord(scheduled, time.perf_counter(), len(ids), False, ("timeout",), phase)
        except httpx.HTTPError:
            return RequestRecord(scheduled, time.perf_counter(), len(ids), False, ("transport",), phase)
        end = time.perf_counter()
        reasons, valid, item_errors = validate_response(
            response.status_code, response.content, ids, self.scorers
        )
        for item_id, scores in valid.items():
            for scorer, value in scores.items():
                self.book.add(item_id, scorer, value)
        self.item_errors.update(item_errors)
        headers = response.headers
        return RequestRecord(
            scheduled,
            end,
            len(ids),
            not reasons,
            tuple(reasons),
            phase,
            header_ms(headers, QUEUE_TIME_HEADER),
            header_ms(headers, INFERENCE_TIME_HEADER),
            header_ms(headers, TOTAL_TIME_HEADER),
        )

    async def _batch_size_delta(
        self, client: httpx.AsyncClient, before: dict[str, tuple[float, float]] | None
    ) -> dict[str, float] | None:
        after = await self.scrape_batch_sizes(client)
        if before is None or after is None:
            return None
        out = {}
        for key, (total, count) in after.items():
            base_total, base_count = before.get(key, (0.0, 0.0))
            if count > base_count:
                out[key] = (total - base_total) / (count - base_count)
        return out or None

    async def coverage_pass(self, batch: int) -> dict[str, Any]:
        """Score every corpus item once, in order, before any load point.

        The sweep alone covers only as many items as its busiest point sends; a coverage pass
        makes per-item parity between deployments cover the whole corpus.
        """
        factory = RequestFactory(self.corpus, self.scorers, min(batch, len(self.corpus)))
        failures: Counter[str] = Counter()
        records = []
        async with self.client(1) as client:
            for _ in range(math.ceil(len(self.corpus) / factory.batch)):
                body, ids = factory.next()
                record = await self.send(client, body, ids, time.perf_counter(), "coverage")
                records.append(record)
                failures.update(record.reasons)
        return {
            "total": len(records),
            "ok": sum(r.ok for r in records),
            "failed": sum(not r.ok for r in records),
            "failures_by_reason": dict(sorted(failures.items())),
        }

    async def closed_loop(self, batch: int, concurrency: int, min_requests: int, warmup: int) -> Measurement:
        factory = RequestFactory(self.corpus, self.scorers, batch)
        policy = self.policy
        records: list[RequestRecord] = []
        measured = [0] * concurrency
        warmed = 0
        all_warm, stop = asyncio.Event(), asyncio.Event()

        async def one(client: httpx.AsyncClient, phase: str) -> RequestRecord:
            body, ids = factory.next()
            record = await self.send(client, body, ids, time.perf_counter(), phase)
            records.append(record)
            if record.reasons in (("transport",), ("timeout",)):
                await asyncio.sleep(_RETRY_PAUSE_S)  # a dead service must not become a hot loop
            return record

        async def client_task(client: httpx.AsyncClient, index: int) -> None:
            nonlocal warmed
            for _ in range(warmup):
                await one(client, "warmup")
            warmed += 1
            if warmed == concurrency:
                all_warm.set()
            await all_warm.wait()
            while not stop.is_set():
                await one(client, "measure")
                measured[index] += 1

        # metrics go over their own connection so scraping never waits behind the load's pool
        async with self.client(concurrency) as client, self.client(1) as control:
            tasks = [asyncio.create_task(client_task(client, i)) for i in range(concurrency)]
            await all_warm.wait()
            before = await self.scrape_batch_sizes(control)
            start = time.perf_counter()
            windows: list[Window] = []
            while True:
                w_start = start + len(windows) * policy.window_s
                w_end = w_start + policy.window_s
                await asyncio.sleep(max(0.0, w_end - time.perf_counter()))
                done = [
                    (r.items, r.latency_ms)
                    for r in records
                    if r.phase == "measure" and r.ok and w_start <= r.end < w_end
                ]
                windows.append(make_window(w_start, w_end, done))
                stable = is_stable(windows, policy)
                met = min(measured) >= min_requests
                if (stable and met) or len(windows) >= policy.max_windows:
                    break
            stop.set()
            await asyncio.gather(*tasks)
            batch_sizes = await self._batch_size_delta(control, before)
        return Measurement(records, windows, start, w_end, stable, met, batch_sizes)

    async def open_loop(
        self, batch: int, rate: float, duration_s: float, warmup: int, seed: int
    ) -> Measurement:
        factory = RequestFactory(self.corpus, self.scorers, batch)
        policy = self.policy
        records: list[RequestRecord] = []
        rng = np.random.default_rng(seed)
        async with self.client(None) as client, self.client(1) as control:
            for _ in range(warmup):
                body, ids = factory.next()
                records.append(await self.send(client, body, ids, time.perf_counter(), "warmup"))
            before = await self.scrape_batch_sizes(control)
            start = time.perf_counter() + 0.01
            offsets = np.cumsum(rng.exponential(1.0 / rate, size=int(rate * duration_s * 2) + 16))
            schedule = [start + float(t) for t in offsets if t < duration_s]

            async def fire(scheduled: float) -> None:
                body, ids = factory.next()
                records.append(await self.send(client, body, ids, scheduled, "measure"))

            tasks = []
            for scheduled in schedule:
                delay = scheduled - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(fire(scheduled)))
            await asyncio.gather(*tasks)
            batch_sizes = await self._batch_size_delta(control, before)
        n_windows = max(1, math.ceil(duration_s / policy.window_s - 1e-9))
        windows = []
        for i in range(n_windows):
            w_start = start + i * policy.window_s
            w_end = min(start + duration_s, w_start + policy.window_s)
            done = [
                (r.items, r.latency_ms)
                for r in records
                if r.phase == "measure" and r.ok and w_start <= r.end < w_end
            ]
            windows.append(make_window(w_start, w_end, done))
        measured = [r for r in records if r.phase == "measure"]
        stop = max([start + duration_s] + [r.end for r in measured])
        return Measurement(records, windows, start, stop, is_stable(windows, policy), True, batch_sizes)


class CallResult(NamedTuple):
    """What one call of a `timed_closed_loop` reports: items scored and failed, and the
    server's timing headers (ms) when it sent them."""

    ok_items: int
    failed_items: int
    queue_ms: float | None = None
    inference_ms: float | None = None


@dataclass
class TimedLoad:
    """One cell of a `timed_closed_loop`: what completed inside the measured window."""

    items_per_s: float
    requests: int
    failed_items: int
    p50_ms: float | None
    p99_ms: float | None
    mean_queue_ms: float | None
    mean_inference_ms: float | None


async def timed_closed_loop(
    call: Callable[[int], Awaitable[CallResult]], concurrency: int, warmup_s: float, measure_s: float
) -> TimedLoad:
    """`concurrency` clients call `call(k)` back to back for `warmup_s + measure_s`; calls that
    complete inside the last `measure_s` count (closed-loop throughput). Client `w` passes
    k = w, w + concurrency, ... so the clients walk disjoint slices of any request list."""
    latencies: list[float] = []
    ok_items = failed_items = 0
    queue: list[float | None] = []
    inference: list[float | None] = []
    t0 = time.perf_counter()
    start, stop = t0 + warmup_s, t0 + warmup_s + measure_s

    async def client(w: int) -> None:
        nonlocal ok_items, failed_items
        k = w
        while (sent := time.perf_counter()) < stop:
            result = await call(k)
            end = time.perf_counter()
            if start <= end <= stop:
                latencies.append((end - sent) * 1000.0)
                ok_items += result.ok_items
                failed_items += result.failed_items
                queue.append(result.queue_ms)
                inference.append(result.inference_ms)
            k += concurrency

    await asyncio.gather(*(client(w) for w in range(concurrency)))
    pct = _percentiles(latencies)
    return TimedLoad(
        items_per_s=ok_items / measure_s,
        requests=len(latencies),
        failed_items=failed_items,
        p50_ms=pct["p50"],
        p99_ms=pct["p99"],
        mean_queue_ms=_mean(queue),
        mean_inference_ms=_mean(inference),
    )


def _percentiles(latencies: list[float]) -> dict[str, float | None]:
    if not latencies:
        return {k: None for k in ("mean", "p50", "p90", "p95", "p99", "max")}
    arr = np.asarray(latencies)
    p50, p90, p95, p99 = np.percentile(arr, [50, 90, 95, 99])
    return {
        "mean": float(arr.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p95": float(p95),
        "p99": float(p99),
        "max": float(arr.max()),
    }


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def _in_statistics(
    measurements: Sequence[Measurement], loop: str, policy: WindowPolicy
) -> tuple[list[RequestRecord], list[tuple[float, float]], list[float]]:
    """(the records statistics come from, each repetition's (start, end), its items/s): a closed
    loop's accepted windows, an open loop's whole measured schedule."""
    stats_records: list[RequestRecord] = []
    intervals: list[tuple[float, float]] = []
    per_rep_rate = []
    for m in measurements:
        measured = [r for r in m.records if r.phase == "measure"]
        if loop == "closed":
            accepted = m.windows[-policy.stable_windows :]
            a, b = accepted[0].start, accepted[-1].end
            chosen = [r for r in measured if a <= r.end < b]
        else:
            a, b = m.start, m.stop
            chosen = measured
        stats_records.extend(chosen)
        intervals.append((a, b))
        per_rep_rate.append(sum(r.items for r in chosen if r.ok) / (b - a))
    return stats_records, intervals, per_rep_rate


def _batch_size_mean(measurements: Sequence[Measurement]) -> dict[str, float] | None:
    """Each batch-size statistic the server reported, averaged over the repetitions that have it."""
    batch_sizes = [m.batch_sizes for m in measurements if m.batch_sizes]
    if not batch_sizes:
        return None
    keys = sorted({k for b in batch_sizes for k in b})
    return {k: float(np.mean([b[k] for b in batch_sizes if k in b])) for k in keys}


def summarize_point(
    measurements: Sequence[Measurement],
    *,
    loop: str,
    n_scorers: int,
    policy: WindowPolicy,
    slo_ms: float | None,
    monitor: ResourceMonitor | None,
    origin: float,
) -> dict[str, Any]:
    """Aggregate the repetitions of one load point into its JSON record.

    Closed loop: statistics come from the accepted (last `stable_windows`) windows of each
    repetition. Open loop: from every measured request, including ones that finished after
    the arrival schedule ended, and throughput is over the time until the last one returned.
    """
    stats_records, intervals, per_rep_rate = _in_statistics(measurements, loop, policy)
    seconds = sum(b - a for a, b in intervals)
    ok = [r for r in stats_records if r.ok]
    items = sum(r.items for r in ok)
    all_records = [r for m in measurements for r in m.records]
    failures: Counter[str] = Counter()
    for r in all_records:
        if not r.ok:
            failures.update(r.reasons)
    latencies = [r.latency_ms for r in ok]
    goodput = None
    if slo_ms is not None:
        goodput = sum(r.items for r in ok if r.latency_ms <= slo_ms) / seconds
    queue = _mean([r.queue_ms for r in ok])
    inference = _mean([r.inference_ms for r in ok])
    total = _mean([r.total_ms for r in ok])
    batch_mean = _batch_size_mean(measurements)
    step = max(1, math.ceil(len(latencies) / MAX_LATENCY_SAMPLES))
    resources = monitor.summarize(intervals) if monitor is not None else None
    return {
        "stable": all(m.stable for m in measurements),
        "min_requests_met": all(m.min_requests_met for m in measurements),
        "measured_s": seconds,
        "requests": {
            "total": len(all_records),
            "ok": sum(r.ok for r in all_records),
            "failed": sum(not r.ok for r in all_records),
            "warmup_failed": sum(not r.ok for r in all_records if r.phase == "warmup"),
            "in_statistics": len(stats_records),
            "failures_by_reason": dict(sorted(failures.items())),
        },
        "items_per_s": items / seconds,
        "scores_per_s": items * n_scorers / seconds,
        "requests_per_s": len(ok) / seconds,
        "items_per_s_repetitions": per_rep_rate,
        "goodput_items_per_s": goodput,
        "latency_ms": _percentiles(latencies),
        "server_timing_ms": {
            "queue_mean": queue,
            "inference_mean": inference,
            "total_mean": total,
            "queue_fraction": None if queue is None or not total else queue / total,
        },
        "batch_size_mean": batch_mean,
        "resources": resources,
        "regime": resources["regime"] if resources else "unknown",
        "windows": [[w.to_json(origin) for w in m.windows] for m in measurements],
        "latency_samples_ms": [round(v, 3) for v in sorted(latencies)[::step]],
    }
