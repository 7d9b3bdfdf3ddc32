"""`POST /v1/score`: score items with one or more scorers (docs/serve.md "API").

The whole-request checks run here, in order (the token is the app's `RequireToken`'s): body size,
JSON or multipart, schema (the
protocol's `parse_score_request`), item count, scorer names, readiness, identity pins, images.
Then every scorer scores every item (`RouteContext.score_all`, which checks each value once
more: even a faulty backend cannot turn NaN into a reward) and the answer is encoded by the
protocol's `score_response`, with the timing headers.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from rewardplane.serve.config import Limits
from rewardplane.serve.multipart import parse_multipart
from rewardplane.serve.protocol import (
    IDEMPOTENCY_KEY_HEADER,
    MAX_IDEMPOTENCY_KEY,
    MULTIPART_REQUEST_PART,
    SCORE_ROUTE,
    ErrorOut,
    ScoreItem,
    ScoreRequest,
    ScoreResponse,
    ServeError,
    items_from_request,
    parse_score_request,
    score_response,
    timing_headers,
)
from rewardplane.serve.routes.context import RouteContext, error_response
from rewardplane.serve.timing import RequestTiming, current_timing

OFF_LOOP_BYTES = 256 * 1024
"""Bodies at least this large are parsed in a thread (smaller ones: a thread hop costs more)."""
OFF_LOOP_ITEMS = 64
"""Requests with more items build them (base64 decoding included) in a thread."""

BODY_MODELS = (ScoreRequest,)
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


def parse_body(body: bytes, content_type: str, limits: Limits) -> tuple[ScoreRequest, dict[str, bytes]]:
    """(the request, its multipart image parts by name) from a JSON or multipart body."""
    parts: dict[str, bytes] = {}
    if content_type.startswith("multipart/form-data"):
        parts = parse_multipart(body, content_type, max_parts=limits.max_items + 1)
        raw_json: Any = parts.pop(MULTIPART_REQUEST_PART, None)
        if raw_json is None:
            raise ServeError("invalid_request", "multipart body needs a 'request' part holding the JSON")
    else:
        raw_json = body
    return parse_score_request(raw_json, max_items=limits.max_items), parts


async def parse(ctx: RouteContext, request: Request) -> tuple[ScoreRequest, dict[str, bytes]]:
    body = await ctx.read_body(request)
    content_type = request.headers.get("content-type", "")
    if len(body) < OFF_LOOP_BYTES:
        return parse_body(body, content_type, ctx.limits)
    # a large body is parsed in a thread, and in pieces that let the GIL go back to the
    # event loop (protocol.parse_score_request), so health probes and other requests answer
    return await asyncio.to_thread(parse_body, body, content_type, ctx.limits)


def build_items(
    req: ScoreRequest, parts: dict[str, bytes], needs_image: bool, limits: Limits
) -> list[ScoreItem]:
    if len(req.items) > limits.max_items:
        raise ServeError("too_many_items", f"{len(req.items)} items exceed the limit of {limits.max_items}")
    # Images are judged per item by the image scorers at admission (header limits, then a
    # full decode, off the event loop): a bad image is that item's `bad_input`, not a 4xx.
    return items_from_request(req, parts, needs_image=needs_image)


def score_router(ctx: RouteContext) -> APIRouter:
    router = APIRouter()
    backend = ctx.backend

    @router.post(
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
            req, parts = await parse(ctx, request)
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
                items = await asyncio.to_thread(build_items, req, parts, needs_image, ctx.limits)
            else:
                items = build_items(req, parts, needs_image, ctx.limits)
            by_scorer = await ctx.score_all(names, items) if items else {n: [] for n in names}
        except ServeError as err:
            ctx.count(SCORE_ROUTE, err.status, err.code, started)
            return error_response(err, headers_now())
        body = score_response(items, by_scorer, {n: (infos[n].version, infos[n].identity) for n in names})
        headers = headers_now()
        if key := request.headers.get(IDEMPOTENCY_KEY_HEADER):
            headers[IDEMPOTENCY_KEY_HEADER] = key[:MAX_IDEMPOTENCY_KEY]
        ctx.count(SCORE_ROUTE, 200, "", started)
        return Response(json.dumps(body, allow_nan=False), media_type="application/json", headers=headers)

    return router
