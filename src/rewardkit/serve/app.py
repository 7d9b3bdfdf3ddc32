"""The HTTP API: `POST /v1/score`, `GET /v1/scorers`, health, metrics (see docs/serve.md).

`create_app(backend, config)` works with any `ScoringBackend`. This module owns the wire
format and the whole-request checks (auth, size limits, schema, images, identity pins); the
backend owns scoring. Everything a scorer returns is checked once more here, so even a faulty
backend cannot turn NaN into a reward: a non-finite value is reported as `non_finite`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
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
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from rewardkit import __version__
from rewardkit.serve.backend import ScoringBackend
from rewardkit.serve.batcher import check_value
from rewardkit.serve.config import ServiceConfig
from rewardkit.serve.errors import ServeError
from rewardkit.serve.images import check_image
from rewardkit.serve.metrics import ServeMetrics
from rewardkit.serve.multipart import parse_multipart
from rewardkit.serve.scorers.base import ItemError, ScoreItem, ScorerInfo
from rewardkit.serve.timing import RequestTiming, current_timing

log = logging.getLogger(__name__)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class MessageIn(_Strict):
    role: str
    content: str


class ImageIn(_Strict):
    b64: str | None = Field(default=None, description="base64 of the encoded image bytes (JPEG/PNG/WebP)")
    part: str | None = Field(default=None, description="name of a multipart file part holding the bytes")


class ItemIn(_Strict):
    id: str = Field(min_length=1, max_length=512)
    prompt: str | list[MessageIn] = ""
    response: str | list[MessageIn] = ""
    image: ImageIn | None = None
    reference: str | None = None


class ScoreRequest(_Strict):
    scorers: list[str] = Field(min_length=1)
    items: list[ItemIn]
    pin: dict[str, str] = Field(default_factory=dict, description="scorer name -> identity; mismatch is 409")


class ErrorOut(BaseModel):
    code: str
    message: str


class ItemOut(BaseModel):
    id: str
    scores: dict[str, float]
    errors: dict[str, ErrorOut]


class ScorerRef(BaseModel):
    version: str
    identity: str


class ScoreResponse(BaseModel):
    results: list[ItemOut]
    scorers: dict[str, ScorerRef]


def _error_response(err: ServeError, headers: dict[str, str] | None = None) -> JSONResponse:
    headers = dict(headers or {})
    if err.retry_after is not None:
        headers["Retry-After"] = str(max(1, round(err.retry_after)))
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def _first_error(exc: ValidationError) -> str:
    e = exc.errors()[0]
    where = ".".join(str(p) for p in e.get("loc", ())) or "body"
    return f"{where}: {e.get('msg', 'invalid')}"


def _messages(value: str | list[MessageIn]) -> str | list[dict[str, str]]:
    return value if isinstance(value, str) else [{"role": m.role, "content": m.content} for m in value]


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


def create_app(
    backend: ScoringBackend, config: ServiceConfig, *, metrics: ServeMetrics | None = None
) -> FastAPI:
    metrics = metrics or ServeMetrics()
    limits = config.limits
    token = config.resolved_token()
    attach = getattr(backend, "attach_metrics", None)
    if attach is not None and getattr(backend, "metrics", None) is None:
        attach(metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        # Load in the background: /health/live answers at once, /health/ready says 503 until warm.
        task = asyncio.create_task(backend.start(), name="backend-start")
        app.state.start_task = task
        try:
            yield
        finally:
            if not task.done():
                task.cancel()
            with contextlib.suppress(BaseException):
                await task
            await backend.stop()

    app = FastAPI(title="rewardkit reward service", version=__version__, lifespan=lifespan)
    app.state.metrics = metrics
    app.state.backend = backend

    def check_auth(request: Request) -> None:
        if token is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            raise ServeError("unauthorized", "missing or wrong bearer token (Authorization: Bearer <token>)")

    def count(route: str, status: int, code: str, started: float) -> None:
        metrics.requests.labels(route, str(status), code).inc()
        metrics.request_latency.labels(route).observe(time.perf_counter() - started)

    @app.exception_handler(ServeError)
    async def _serve_error(request: Request, exc: ServeError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"code": "invalid_request", "message": str(exc.errors()[:1])}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse({"code": code, "message": str(exc.detail)}, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return JSONResponse({"code": "internal", "message": f"{type(exc).__name__}"}, status_code=500)

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
        parts: dict[str, bytes] = {}
        if content_type.startswith("multipart/form-data"):
            parts = parse_multipart(body, content_type, max_parts=limits.max_items + 1)
            raw_json: Any = parts.pop("request", None)
            if raw_json is None:
                raise ServeError("invalid_request", "multipart body needs a 'request' part holding the JSON")
        else:
            raw_json = body
        try:
            raw = json.loads(raw_json)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise ServeError("invalid_json", f"body is not valid JSON: {exc}") from None
        try:
            req = ScoreRequest.model_validate(raw)
        except ValidationError as exc:
            raise ServeError("invalid_request", _first_error(exc)) from None
        return req, parts

    def build_items(req: ScoreRequest, parts: dict[str, bytes], needs_image: bool) -> list[ScoreItem]:
        if len(req.items) > limits.max_items:
            raise ServeError(
                "too_many_items", f"{len(req.items)} items exceed the limit of {limits.max_items}"
            )
        seen: set[str] = set()
        items = []
        for i, item in enumerate(req.items):
            if item.id in seen:
                raise ServeError("invalid_request", f"items[{i}].id {item.id!r} is duplicated")
            seen.add(item.id)
            image = None
            if item.image is not None:
                if (item.image.b64 is None) == (item.image.part is None):
                    raise ServeError("invalid_request", f"items[{i}].image needs exactly one of b64 or part")
                if item.image.b64 is not None:
                    try:
                        image = base64.b64decode(item.image.b64, validate=True)
                    except (binascii.Error, ValueError):
                        raise ServeError("bad_image", f"items[{i}].image.b64 is not valid base64") from None
                else:
                    if item.image.part not in parts:
                        raise ServeError(
                            "invalid_request", f"items[{i}].image.part {item.image.part!r} not in body"
                        )
                    image = parts[item.image.part]
                check_image(image, limits.max_image_pixels, where=f"items[{i}].image")
            elif needs_image:
                raise ServeError(
                    "missing_image", f"items[{i}] has no image but an image scorer was requested"
                )
            items.append(
                ScoreItem(item.id, _messages(item.prompt), _messages(item.response), image, item.reference)
            )
        return items

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
        return dict(zip(names, outs, strict=True))

    @app.post(
        "/v1/score",
        response_model=ScoreResponse,
        responses={
            401: {"model": ErrorOut},
            409: {"model": ErrorOut},
            413: {"model": ErrorOut},
            422: {"model": ErrorOut},
            429: {"model": ErrorOut},
            503: {"model": ErrorOut},
            504: {"model": ErrorOut},
        },
    )
    async def score(request: Request) -> Response:
        """Score items with one or more scorers. JSON body (`ScoreRequest`) or multipart/form-data with a
        `request` part holding the JSON and one file part per image (`"image": {"part": "<name>"}`)."""
        started = time.perf_counter()
        timing = RequestTiming()
        current_timing.set(timing)

        def timing_headers() -> dict[str, str]:
            return {
                "x-queue-time": f"{timing.queue_s * 1000:.3f}",
                "x-inference-time": f"{timing.inference_s * 1000:.3f}",
                "x-total-time": f"{(time.perf_counter() - started) * 1000:.3f}",
            }

        try:
            check_auth(request)
            req, parts = await parse(request)
            names = list(dict.fromkeys(req.scorers))
            configured = set(backend.scorer_names())
            unknown = [n for n in names if n not in configured]
            if unknown:
                raise ServeError("unknown_scorer", f"unknown scorers {unknown}; known: {sorted(configured)}")
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
            items = build_items(req, parts, needs_image)
            by_scorer = await score_all(names, items) if items else {n: [] for n in names}
        except ServeError as err:
            count("/v1/score", err.status, err.code, started)
            return _error_response(err, timing_headers())
        results = []
        for i, item in enumerate(items):
            scores: dict[str, float] = {}
            errors: dict[str, dict[str, str]] = {}
            for name in names:
                r = by_scorer[name][i]
                if isinstance(r, ItemError):
                    errors[name] = {"code": r.code, "message": r.message}
                else:
                    scores[name] = r
            results.append({"id": item.id, "scores": scores, "errors": errors})
        body = {
            "results": results,
            "scorers": {n: {"version": infos[n].version, "identity": infos[n].identity} for n in names},
        }
        headers = timing_headers()
        if key := request.headers.get("idempotency-key"):
            headers["idempotency-key"] = key[:128]
        count("/v1/score", 200, "", started)
        return Response(json.dumps(body, allow_nan=False), media_type="application/json", headers=headers)

    @app.get("/v1/scorers")
    async def scorers(request: Request) -> dict[str, Any]:
        check_auth(request)
        infos = backend.scorer_infos()
        _, details = backend.ready()
        return {
            "scorers": [_info_json(infos[n]) for n in backend.scorer_names() if n in infos],
            "status": details,
        }

    if hasattr(backend, "deployment"):  # the deploy gateway / Ray backend (docs/deploy.md)

        @app.get("/v1/deployment")
        async def deployment(request: Request) -> dict[str, Any]:
            check_auth(request)
            return await asyncio.to_thread(backend.deployment)

    @app.get("/health/live")
    async def live() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/health/ready")
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

    @app.get("/metrics")
    async def prometheus(request: Request) -> Response:
        check_auth(request)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
