"""The HTTP API's frontend: `create_app(backend, config)` (docs/serve.md).

`create_app` works with any `ScoringBackend` and composes: the backend's start and stop around
the app's lifespan, bearer-token auth for every path but the probes, a metrics count of every
response, one JSON error body for every failure, the routes of `rewardplane.serve.routes` (one
module per route family, each with the whole-request checks of its wire format) and the OpenAPI
document. The backend owns batching and scoring; the bodies are `rewardplane.serve.protocol`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from rewardplane import __version__
from rewardplane.serve.audit import AuditStream
from rewardplane.serve.audit.metrics import AuditMetrics
from rewardplane.serve.backend import ScoringBackend
from rewardplane.serve.config import ServiceConfig
from rewardplane.serve.metrics import CountEveryResponse, ServeMetrics
from rewardplane.serve.protocol import (
    HTTP_ERROR_CODE,
    LIVE_ROUTE,
    READY_ROUTE,
    ROUTE_ERROR_CODES,
    SCORE_ROUTE,
    UNIRL_HEALTH_ROUTE,
    ServeError,
    error_body,
    timing_headers,
)
from rewardplane.serve.routes import BODY_MODELS, RouteContext, error_response, route_paths, service_routers
from rewardplane.serve.scorers.registry import kind_option_schemas

log = logging.getLogger(__name__)

UNAUTHORIZED_MESSAGE = "missing or wrong bearer token (Authorization: Bearer <token>)"
OPEN_ROUTES = (LIVE_ROUTE, READY_ROUTE, UNIRL_HEALTH_ROUTE)
"""The probes: the only routes of the service answered without the token."""


class RequireToken:
    """ASGI middleware, the service's one authentication: with a token configured, every path
    but the probes (`OPEN_ROUTES`) and the OpenAPI document's pages needs
    `Authorization: Bearer <token>`, whichever module added the route (the trainer protocols'
    `/score`, `/rewards` and `/get_reward` as much as `/v1/*` and `/metrics`, and a path no
    route answers yet); a 401 `unauthorized` JSON error otherwise."""

    def __init__(self, app: Any, token: str, open_paths: frozenset[str]) -> None:
        self.app = app
        self.token = token.encode()
        self.open_paths = open_paths

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else None
        if path is not None and path not in self.open_paths and not self._authorized(scope):
            err = ServeError("unauthorized", UNAUTHORIZED_MESSAGE)
            headers = (
                timing_headers(queue_s=0.0, inference_s=0.0, total_s=0.0) if path == SCORE_ROUTE else None
            )
            await error_response(err, headers)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: dict) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, given = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token)
        return False


def _lifespan(backend: ScoringBackend, audit: AuditStream | None):
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

    return lifespan


def install_error_handlers(app: FastAPI) -> None:
    """Every failure as a `{"code", "message"}` body: ServeErrors with their status, framework
    errors with the route codes, anything else a 500 `internal` (logged, never its text)."""

    @app.exception_handler(ServeError)
    async def _serve_error(request: Request, exc: ServeError) -> JSONResponse:
        return error_response(exc)

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


def install_openapi(app: FastAPI) -> None:
    """FastAPI's document plus the schemas of the bodies routes read raw (`BODY_MODELS`: size
    limit, multipart, trainer wire formats), which no handler parameter declares."""
    default_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = default_openapi()
            components = doc.setdefault("components", {}).setdefault("schemas", {})
            for model in BODY_MODELS:
                schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(schema.pop("$defs", {}))
                components[model.__name__] = schema
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(
    backend: ScoringBackend, config: ServiceConfig, *, metrics: ServeMetrics | None = None
) -> FastAPI:
    metrics = metrics or ServeMetrics()
    token = config.resolved_token()
    attach = getattr(backend, "attach_metrics", None)
    if attach is not None and getattr(backend, "metrics", None) is None:
        attach(metrics)
    # the audit stream (docs/audit.md): offered every proxy score, never delays a response
    audit = AuditStream(config.audit, backend, AuditMetrics(metrics.registry)) if config.audit else None
    app = FastAPI(title="rewardplane reward service", version=__version__, lifespan=_lifespan(backend, audit))
    routers = service_routers(
        RouteContext(backend, config.limits, metrics, kind_option_schemas(config.scorers), audit)
    )
    for router in routers:
        app.include_router(router)
    paths = route_paths(routers)
    if token is not None:  # every route but the probes, present and future
        documents = {app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url}
        app.add_middleware(
            RequireToken, token=token, open_paths=frozenset({*OPEN_ROUTES, *documents} - {None})
        )
    app.add_middleware(  # every response, 5xx and 401 included
        CountEveryResponse,
        metrics=metrics,
        known_paths=lambda: paths | {getattr(r, "path", None) for r in app.routes},
    )
    app.state.metrics = metrics
    app.state.backend = backend
    install_error_handlers(app)
    install_openapi(app)
    return app
