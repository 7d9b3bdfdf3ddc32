"""The HTTP API: `POST /v1/score`, `GET /v1/scorers`, health, metrics (see docs/serve.md).

`create_app(backend, config)` works with any `ScoringBackend`. This module is the frontend:
it applies the whole-request checks (auth, size limits, schema, images, identity pins) to
bodies defined in `rewardplane.serve.protocol`; the backend owns batching and scoring. Everything a scorer returns is checked once more here, so even a faulty
backend cannot turn NaN into a reward: a non-finite value is reported as `non_finite`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from rewardplane import __version__
from rewardplane.serve.audit import AuditStream
from rewardplane.serve.audit.metrics import AuditMetrics
from rewardplane.serve.backend import ScoringBackend
from rewardplane.serve.batcher import check_value
from rewardplane.serve.config import ServiceConfig
from rewardplane.serve.lifecycle import install_routes as install_lifecycle_routes
from rewardplane.serve.metrics import CountEveryResponse, ServeMetrics, mark_counted
from rewardplane.serve.multipart import parse_multipart
from rewardplane.serve.protocol import (
    DEPLOYMENT_ROUTE,
    HTTP_ERROR_CODE,
    IDEMPOTENCY_KEY_HEADER,
    LIVE_ROUTE,
    MAX_IDEMPOTENCY_KEY,
    METRICS_ROUTE,
    MULTIPART_REQUEST_PART,
    READY_ROUTE,
    RETRY_AFTER_HEADER,
    ROUTE_ERROR_CODES,
    SCORE_ROUTE,
    SCORERS_ROUTE,
    ErrorOut,
    LiveOut,
    NotReadyOut,
    ReadyOut,
    ScoreRequest,
    ScoreResponse,
    ScorersResponse,
    ServeError,
    error_body,
    items_from_request,
    parse_score_request,
    score_response,
    timing_headers,
)
from rewardplane.serve.routes import RouteContext, trainer_routes
from rewardplane.serve.routes.audit import audit_router
from rewardplane.serve.scorers.base import ItemError, ScoreItem, ScorerInfo
from rewardplane.serve.timing import RequestTiming, current_timing

log = logging.getLogger(__name__)


def _error_response(err: ServeError, headers: dict[str, str] | None = None) -> JSONResponse:
    headers = dict(headers or {})
    if err.retry_after is not None:
        headers[RETRY_AFTER_HEADER] = str(max(1, round(err.retry_after)))
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def _info_json(info: ScorerInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "kind": info.kind,
        "modality": info.modality,
        "dtype": info.dtype,
        "device": info.device,
        "version": info.version,
        "identity": info.identity,
        "max_batch_size": info.max_batch_size,
        "max_wait_ms": info.max_wait_ms,
        **({"extra": info.extra} if info.extra else {}),
    }


class RequireToken:
    """ASGI middleware: with a token configured, every `/v1/*` path (and `/metrics`) needs
    `Authorization: Bearer <token>`, whichever module added the route; a 401 `unauthorized`
    JSON error otherwise. `/health/*` and the OpenAPI document stay open for probes."""

    PROTECTED = ("/v1/", METRICS_ROUTE)

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path.startswith(self.PROTECTED) and not self._authorized(scope):
            err = ServeError("unauthorized", "missing or wrong bearer token (Authorization: Bearer <token>)")
            headers = (
                timing_headers(queue_s=0.0, inference_s=0.0, total_s=0.0) if path == SCORE_ROUTE else None
            )
            await _error_response(err, headers)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: dict) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, given = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token)
        return False


OFF_LOOP_BYTES = 256 * 1024
"""Bodies at least this large are parsed in a thread (smaller ones: a thread hop costs more)."""
OFF_LOOP_ITEMS = 64
"""Requests with more items build them (base64 decoding included) in a thread."""

SCORE_REQUEST_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/ScoreRequest"}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": [MULTIPART_REQUEST_PART],
                    "properties": {
                        MULTIPART_REQUEST_PART: {
                            "type": "string",
                            "description": "the ScoreRequest JSON; items refer to image parts by name",
                        }
                    },
                    "additionalProperties": {"type": "string", "format": "binary"},
                }
            },
        },
    }
}


def _raw_bodies() -> dict[tuple[str, str], tuple[type, bool]]:
    """(method, path) → (body model, required) for routes that read their JSON body raw, so
    the OpenAPI document still declares it (protocol.py holds every model)."""
    from rewardplane.serve import protocol as p

    bodies: dict[tuple[str, str], tuple[type, bool]] = {
        ("post", f"{p.LIFECYCLE_ROUTE}/{action}"): (p.LifecycleRequest, False)
        for action in ("offload", "onload", "drain")
    }
    bodies[("post", p.OPENRLHF_ROUTE)] = (p.OpenRLHFRewardRequest, True)
    bodies[("post", p.GATEWAY_SCORE_ROUTE)] = (p.GatewayScoreRequest, True)
    return bodies


RAW_BODIES = _raw_bodies()


def create_app(
    backend: ScoringBackend, config: ServiceConfig, *, metrics: ServeMetrics | None = None
) -> FastAPI:
    metrics = metrics or ServeMetrics()
    limits = config.limits
    token = config.resolved_token()
    attach = getattr(backend, "attach_metrics", None)
    if attach is not None and getattr(backend, "metrics", None) is None:
        attach(metrics)
    # the audit stream (docs/audit.md): offered every proxy score, never delays a response
    audit = AuditStream(config.audit, backend, AuditMetrics(metrics.registry)) if config.audit else None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        # Load in the background: /health/live answers at once, /health/ready says 503 until warm.
        task = asyncio.create_task(backend.start(), name="backend-start")
        app.state.start_task = task
        if audit is not None:
            await audit.start()
        try:
            yield
        finally:
            if audit is not None:
                await audit.stop()
            if not task.done():
                task.cancel()
            with contextlib.suppress(BaseException):
                await task
            await backend.stop()

    app = FastAPI(title="rewardplane reward service", version=__version__, lifespan=lifespan)
    if token is not None:
        app.add_middleware(RequireToken, token=token)  # every /v1/* route, present and future
    app.add_middleware(  # every response, 5xx and 401 included
        CountEveryResponse,
        metrics=metrics,
        known_paths=lambda: {getattr(r, "path", None) for r in app.routes},
    )
    app.state.metrics = metrics
    app.state.backend = backend
    app.state.audit = audit

    def check_auth(request: Request) -> None:
        if token is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            raise ServeError("unauthorized", "missing or wrong bearer token (Authorization: Bearer <token>)")

    def count(route: str, status: int, code: str, started: float) -> None:
        mark_counted()  # the middleware counts whatever a handler does not
        metrics.requests.labels(route, str(status), code).inc()
        metrics.request_latency.labels(route).observe(time.perf_counter() - started)

    @app.exception_handler(ServeError)
    async def _serve_error(request: Request, exc: ServeError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body("invalid_request", str(exc.errors()[:1])[:300]), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = ROUTE_ERROR_CODES.get(exc.status_code, HTTP_ERROR_CODE)
        return JSONResponse(error_body(code, str(exc.detail)[:300]), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return JSONResponse(error_body("internal", f"{type(exc).__name__}"), status_code=500)

    async def read_body(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
            raise ServeError("body_too_large", f"body of {declared} bytes exceeds {limits.max_body_bytes}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limits.max_body_bytes:
                raise ServeError("body_too_large", f"body exceeds {limits.max_body_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def parse(request: Request) -> tuple[ScoreRequest, dict[str, bytes]]:
        body = await read_body(request)
        content_type = request.headers.get("content-type", "")
        if len(body) < OFF_LOOP_BYTES:
            return parse_sync(body, content_type)
        # a large body is parsed in a thread, and in pieces that let the GIL go back to the
        # event loop (protocol.parse_score_request), so health probes and other requests answer
        return await asyncio.to_thread(parse_sync, body, content_type)

    def parse_sync(body: bytes, content_type: str) -> tuple[ScoreRequest, dict[str, bytes]]:
        parts: dict[str, bytes] = {}
        if content_type.startswith("multipart/form-data"):
            parts = parse_multipart(body, content_type, max_parts=limits.max_items + 1)
            raw_json: Any = parts.pop(MULTIPART_REQUEST_PART, None)
            if raw_json is None:
                raise ServeError("invalid_request", "multipart body needs a 'request' part holding the JSON")
        else:
            raw_json = body
        return parse_score_request(raw_json, max_items=limits.max_items), parts

    def build_items(req: ScoreRequest, parts: dict[str, bytes], needs_image: bool) -> list[ScoreItem]:
        if len(req.items) > limits.max_items:
            raise ServeError(
                "too_many_items", f"{len(req.items)} items exceed the limit of {limits.max_items}"
            )
        # Images are judged per item by the image scorers at admission (header limits, then a
        # full decode, off the event loop): a bad image is that item's `bad_input`, not a 4xx.
        return items_from_request(req, parts, needs_image=needs_image)

    async def score_all(names: list[str], items: list[ScoreItem]) -> dict[str, list[Any]]:
        async def one(name: str) -> list[Any]:
            try:
                results = await backend.score(name, items)
            except ServeError:
                raise
            except Exception as exc:  # one scorer failing must not fail the others
                log.exception("backend failed for scorer %s", name)
                return [ItemError("scorer_failed", f"{type(exc).__name__}: {exc}"[:500])] * len(items)
            if len(results) != len(items):
                return [ItemError("scorer_failed", f"backend returned {len(results)} results")] * len(items)
            return [check_value(r) for r in results]

        try:
            outs = await asyncio.wait_for(
                asyncio.gather(*(one(n) for n in names), return_exceptions=True), limits.request_timeout_s
            )
        except TimeoutError:
            raise ServeError("timeout", f"request took over {limits.request_timeout_s:g}s") from None
        for out in outs:
            if isinstance(out, BaseException):
                raise out
        results = dict(zip(names, outs, strict=True))
        if audit is not None:
            audit.observe(names, items, results)
        return results

    @app.post(
        SCORE_ROUTE,
        response_model=ScoreResponse,
        responses={status: {"model": ErrorOut} for status in (401, 409, 413, 422, 429, 500, 503, 504)},
        openapi_extra=SCORE_REQUEST_BODY,  # the body is read raw (size limit, multipart): declare it
    )
    async def score(request: Request) -> Response:
        """Score items with one or more scorers. JSON body (`ScoreRequest`) or multipart/form-data with a
        `request` part holding the JSON and one file part per image (`"image": {"part": "<name>"}`)."""
        started = time.perf_counter()
        timing = RequestTiming()
        current_timing.set(timing)

        def headers_now() -> dict[str, str]:
            total_s = time.perf_counter() - started
            return timing_headers(queue_s=timing.queue_s, inference_s=timing.inference_s, total_s=total_s)

        try:
            check_auth(request)
            req, parts = await parse(request)
            names = list(dict.fromkeys(req.scorers))
            configured = set(backend.scorer_names())
            unknown = [n for n in names if n not in configured]
            if unknown:
                raise ServeError(
                    "unknown_scorer", f"unknown scorers {unknown}; known: {sorted(configured)}"[:1000]
                )
            infos = backend.scorer_infos()
            missing = [n for n in names if n not in infos]
            if missing:
                raise ServeError("not_ready", f"scorers {missing} are not ready", retry_after=5)
            for name, identity in req.pin.items():
                if name not in names:
                    raise ServeError("invalid_request", f"pin names scorer {name!r} that is not requested")
                if identity != infos[name].identity:
                    raise ServeError(
                        "identity_mismatch",
                        f"scorer {name!r} has identity {infos[name].identity}, request pinned {identity}",
                    )
            needs_image = any(infos[n].modality == "image_text" for n in names)
            if len(req.items) > OFF_LOOP_ITEMS:  # base64 of many images: off the event loop
                items = await asyncio.to_thread(build_items, req, parts, needs_image)
            else:
                items = build_items(req, parts, needs_image)
            by_scorer = await score_all(names, items) if items else {n: [] for n in names}
        except ServeError as err:
            count(SCORE_ROUTE, err.status, err.code, started)
            return _error_response(err, headers_now())
        body = score_response(items, by_scorer, {n: (infos[n].version, infos[n].identity) for n in names})
        headers = headers_now()
        if key := request.headers.get(IDEMPOTENCY_KEY_HEADER):
            headers[IDEMPOTENCY_KEY_HEADER] = key[:MAX_IDEMPOTENCY_KEY]
        count(SCORE_ROUTE, 200, "", started)
        return Response(json.dumps(body, allow_nan=False), media_type="application/json", headers=headers)

    # OpenRLHF /get_reward and the reward-gateway /score, /health, /rewards (docs/integrations.md)
    app.include_router(trainer_routes(RouteContext(backend, limits, check_auth, read_body, score_all, count)))
    if audit is not None:
        app.include_router(audit_router(audit, check_auth))  # GET /v1/audit (docs/audit.md)

    @app.get(
        SCORERS_ROUTE,
        response_model=ScorersResponse,
        response_model_exclude_unset=True,
        responses={401: {"model": ErrorOut}},
    )
    async def scorers(request: Request) -> dict[str, Any]:
        check_auth(request)
        infos = backend.scorer_infos()
        _, details = backend.ready()
        return {
            "scorers": [_info_json(infos[n]) for n in backend.scorer_names() if n in infos],
            "status": details,
        }

    if hasattr(backend, "deployment"):  # the deploy gateway / Ray backend (docs/deploy.md)

        @app.get(
            DEPLOYMENT_ROUTE,
            responses={
                200: {"description": "the layout and live state of every worker (docs/deploy.md)"},
                401: {"model": ErrorOut},
            },
        )
        async def deployment(request: Request) -> dict[str, Any]:
            check_auth(request)
            return await asyncio.to_thread(backend.deployment)

    if hasattr(backend, "lifecycle_action"):  # offload / onload / drain (docs/lifecycle.md)
        install_lifecycle_routes(app, backend, check_auth)

    @app.get(LIVE_ROUTE, response_model=LiveOut)
    async def live() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(READY_ROUTE, response_model=ReadyOut, responses={503: {"model": NotReadyOut}})
    async def ready() -> JSONResponse:
        ok, details = backend.ready()
        task = getattr(app.state, "start_task", None)
        if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
            ok, details = False, {**details, "_start": f"failed: {task.exception()!r}"[:300]}
        if ok:
            return JSONResponse({"ready": True, "scorers": details})
        return JSONResponse(
            {"code": "not_ready", "message": "scorers are loading, warming up or broken", "scorers": details},
            status_code=503,
            headers={"Retry-After": "5"},
        )

    @app.get(
        METRICS_ROUTE,
        response_class=Response,
        responses={
            200: {
                "description": "Prometheus text format",
                "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
            },
            401: {"model": ErrorOut},
        },
    )
    async def prometheus(request: Request) -> Response:
        check_auth(request)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    default_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        """FastAPI's document plus the request bodies that no handler parameter declares
        (handlers that read their body raw: size limit, multipart, trainer wire formats)."""
        if app.openapi_schema is None:
            doc = default_openapi()
            components = doc.setdefault("components", {}).setdefault("schemas", {})
            for model in (ScoreRequest, *(m for m, _ in RAW_BODIES.values())):
                schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(schema.pop("$defs", {}))
                components[model.__name__] = schema
            for (method, path), (model, required) in RAW_BODIES.items():
                op = doc.get("paths", {}).get(path, {}).get(method)
                if op is not None and "requestBody" not in op:
                    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
                    op["requestBody"] = {
                        "required": required,
                        "content": {"application/json": {"schema": ref}},
                    }
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
