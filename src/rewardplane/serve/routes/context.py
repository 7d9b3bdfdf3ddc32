"""What every route borrows from the app: `RouteContext` (body reader, metrics, the scoring
core), and the one way a `ServeError` becomes a response. Authentication is not a route's: the
app's `RequireToken` middleware guards every path but the open ones, whichever module added it.

Every route module builds a FastAPI `APIRouter` from one context, so a route can be mounted and
tested on its own (`FastAPI().include_router(score_router(ctx))`), and the trainer protocols'
routes apply exactly the checks and the non-finite guard of `POST /v1/score`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from rewardplane.serve.audit import AuditStream
from rewardplane.serve.backend import ScoringBackend
from rewardplane.serve.batcher import check_value
from rewardplane.serve.config import Limits
from rewardplane.serve.metrics import ServeMetrics, mark_counted
from rewardplane.serve.protocol import RETRY_AFTER_HEADER, ItemError, ScoreItem, ServeError

log = logging.getLogger(__name__)


def error_response(err: ServeError, headers: dict[str, str] | None = None) -> JSONResponse:
    """`err` as its JSON response, `Retry-After` (whole seconds, at least 1) when it has one."""
    headers = dict(headers or {})
    if err.retry_after is not None:
        headers[RETRY_AFTER_HEADER] = str(max(1, round(err.retry_after)))
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


@dataclass(frozen=True)
class RouteContext:
    """What a route borrows from the app (`rewardplane.serve.app.create_app`)."""

    backend: ScoringBackend
    limits: Limits
    metrics: ServeMetrics
    kinds: dict[str, Any] = field(default_factory=dict)
    """Each hosted kind's option schemas (`serve.scorers.registry.kind_option_schemas`), for `/v1/scorers`."""
    audit: AuditStream | None = None
    """The audit stream (docs/audit.md), offered every scored request; None: no `audit:` section."""

    async def read_body(self, request: Request) -> bytes:
        """The body, with `max_body_bytes` enforced while streaming (413 `body_too_large`)."""
        limit = self.limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ServeError("body_too_large", f"body of {declared} bytes exceeds {limit}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ServeError("body_too_large", f"body exceeds {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def count(self, route: str, status: int, code: str, started: float) -> None:
        """Metrics for one answered request (`started`: its `time.perf_counter()`)."""
        mark_counted()  # the middleware counts whatever a handler does not
        self.metrics.requests.labels(route, str(status), code).inc()
        self.metrics.request_latency.labels(route).observe(time.perf_counter() - started)

    async def score_all(self, names: list[str], items: list[ScoreItem]) -> dict[str, list[Any]]:
        """name → one checked result per item (a finite float or an `ItemError`). One scorer
        failing fails its items, not the others; whole-request failures (`queue_full`,
        `not_ready`, `timeout`, ...) raise `ServeError`."""

        async def one(name: str) -> list[Any]:
            try:
                results = await self.backend.score(name, items)
            except ServeError:
                raise
            except Exception as exc:  # one scorer failing must not fail the others
                log.exception("backend failed for scorer %s", name)
                return [ItemError("scorer_failed", f"{type(exc).__name__}: {exc}"[:500])] * len(items)
            if len(results) != len(items):
                return [ItemError("scorer_failed", f"backend returned {len(results)} results")] * len(items)
            return [check_value(r) for r in results]

        timeout_s = self.limits.request_timeout_s
        try:
            outs = await asyncio.wait_for(
                asyncio.gather(*(one(n) for n in names), return_exceptions=True), timeout_s
            )
        except TimeoutError:
            raise ServeError("timeout", f"request took over {timeout_s:g}s") from None
        for out in outs:
            if isinstance(out, BaseException):
                raise out
        results = dict(zip(names, outs, strict=True))
        if self.audit is not None:  # a non-blocking offer: never delays or fails the response
            self.audit.observe(names, items, results)
        return results

    def ready_names(self, names: list[str]) -> tuple[list[str], list[str]]:
        """(names the service does not host, hosted names not loaded yet)."""
        configured = set(self.backend.scorer_names())
        infos = self.backend.scorer_infos()
        unknown = [n for n in names if n not in configured]
        loading = [n for n in names if n in configured and n not in infos]
        return unknown, loading


def raw_body(model: type, *, required: bool = True) -> dict[str, Any]:
    """`openapi_extra` for a route that reads its JSON body raw (size limit, its own guards):
    the body `model` in the OpenAPI document, as a parameter would declare it. The route
    module lists `model` in its `BODY_MODELS`, whose schemas the app adds to the document."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": ref}}}}
