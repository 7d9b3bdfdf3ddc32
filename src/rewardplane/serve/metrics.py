"""Prometheus metrics, one registry per app so several services (and tests) never collide.

The batch-size and queue-delay histograms are what let a load test split queueing from compute;
`non_finite` counts values a scorer produced that were turned into errors instead of rewards.
"""

from __future__ import annotations

import collections
import json
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def outcome(result: object) -> str:
    """A batch result as the metrics label it: "ok" for a score, else the item's error code."""
    return "ok" if isinstance(result, float) else getattr(result, "code", "scorer_failed")


TOKEN_KINDS = ("real", "computed", "padding", "shared")
"""Token accounting kinds a text scorer reports per batch (`Scorer.take_batch_stats`); any other
key a scorer reports there is counted in `rewardplane_scorer_events_total`."""


@dataclass(frozen=True)
class BatchStats:
    """One forward as the metrics see it. Plain data so a deploy worker can relay it as JSON."""

    scorer: str
    inference_s: float
    queue_delays: tuple[float, ...]  # one per item: enqueue → batch start
    outcomes: tuple[str, ...]  # one per item: "ok" or the item's error code
    tokens: dict[str, int] = field(default_factory=dict)  # real / computed / padding / shared


class ServeMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "rewardplane_requests",
            "HTTP requests by route, status and error code",
            ["route", "status", "code"],
            registry=r,
        )
        self.request_latency = Histogram(
            "rewardplane_request_latency_seconds",
            "End-to-end request latency",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.items = Counter(
            "rewardplane_items",
            "Items scored, by scorer and outcome (ok or error code)",
            ["scorer", "outcome"],
            registry=r,
        )
        self.non_finite = Counter(
            "rewardplane_non_finite", "Non-finite scores turned into errors", ["scorer"], registry=r
        )
        self.batch_size = Histogram(
            "rewardplane_batch_size",
            "Achieved batch size per forward",
            ["scorer"],
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.queue_delay = Histogram(
            "rewardplane_queue_delay_seconds",
            "Time items wait before their batch starts",
            ["scorer"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inference = Histogram(
            "rewardplane_inference_seconds",
            "Scorer time per batch",
            ["scorer"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "rewardplane_queue_depth", "Items waiting per scorer", ["scorer"], registry=r
        )
        self.tokens = Counter(
            "rewardplane_tokens",
            "Text scorers' tokens by kind: real (the items'), computed (forwarded), padding (computed"
            " pad slots), shared (prompt tokens computed once for a group instead of per item)",
            ["scorer", "kind"],
            registry=r,
        )
        self.scorer_events = Counter(
            "rewardplane_scorer_events",
            "Scorer-specific counts by scorer and event, e.g. the code scorer's assert-style cases:"
            " tests_evaluated (run in the trusted evaluator), tests_inside (run in the program's process: unsafe_run_inside)",
            ["scorer", "event"],
            registry=r,
        )
        self.batch_tokens = Histogram(
            "rewardplane_batch_tokens",
            "Tokens computed per forward",
            ["scorer"],
            buckets=(256, 1024, 4096, 16384, 32768, 65536, 131072, 262144),
            registry=r,
        )

    def observe_batch(self, stats: BatchStats) -> None:
        """The per-batch observations, in one place: the in-process batcher calls this directly,
        the deploy gateway calls it for every batch a worker relays, so /metrics reads the same."""
        name = stats.scorer
        self.batch_size.labels(name).observe(len(stats.queue_delays))
        self.inference.labels(name).observe(stats.inference_s)
        delays = self.queue_delay.labels(name)  # one label lookup per batch, not per item
        for delay in stats.queue_delays:
            delays.observe(delay)
        for outcome, count in collections.Counter(stats.outcomes).items():
            self.items.labels(name, outcome).inc(count)
            if outcome == "non_finite":
                self.non_finite.labels(name).inc(count)
        for kind, count in stats.tokens.items():  # token kinds; any other key is a scorer event
            (self.tokens if kind in TOKEN_KINDS else self.scorer_events).labels(name, kind).inc(count)
        if stats.tokens.get("computed"):
            self.batch_tokens.labels(name).observe(stats.tokens["computed"])


_counted: ContextVar[list[bool] | None] = ContextVar("rewardplane_counted", default=None)


def mark_counted() -> None:
    """A handler counted its own response (with its own route label): the middleware skips it."""
    flag = _counted.get()
    if flag is not None:
        flag.append(True)


class CountEveryResponse:
    """ASGI middleware: every HTTP response is counted in `rewardplane_requests_total` by route,
    status and error code, including 404/405, framework 422s, 500s from unhandled exceptions
    and routes that do not count themselves. The route label is the matched route's path
    template (an unmatched path is `unmatched`, so a scan cannot explode the label set); the code
    is the error body's `code` (empty for a success)."""

    def __init__(self, app: Any, metrics: ServeMetrics, known_paths: Any = None) -> None:
        self.app = app
        self.metrics = metrics
        self.known_paths = known_paths  # () -> the app's route paths, for answers given before routing

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        flag: list[bool] = []
        token = _counted.set(flag)
        status = 0
        body = bytearray()

        async def watch(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body" and status >= 400 and len(body) < 4096:
                body.extend(message.get("body", b"")[: 4096 - len(body)])
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except BaseException:
            if not flag:
                self._count(scope, 500, "internal", started)
            raise
        finally:
            _counted.reset(token)
        if not flag:
            self._count(scope, status, _code(status, bytes(body)), started)

    def _count(self, scope: dict, status: int, code: str, started: float) -> None:
        route = getattr(scope.get("route"), "path", None)
        if route is None:  # answered before routing (a 401 from the token check) or no route
            path = scope.get("path", "")
            route = path if self.known_paths is not None and path in self.known_paths() else "unmatched"
        self.metrics.requests.labels(route, str(status), code).inc()
        self.metrics.request_latency.labels(route).observe(time.perf_counter() - started)


def _code(status: int, body: bytes) -> str:
    if status < 400:
        return ""
    try:
        code = json.loads(body).get("code")
    except (ValueError, AttributeError):
        code = None
    return code if isinstance(code, str) and len(code) <= 64 else "http_error"
