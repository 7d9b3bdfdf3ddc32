"""`/v1/lifecycle`: offload, onload and drain scorers, and read their states (docs/lifecycle.md).

For a backend with `lifecycle_action(action, scorers, timeout_s)` and `lifecycle_state()`
(in-process, the deploy gateway, Ray Serve); the state machine itself is
`rewardplane.serve.lifecycle`, which knows nothing of HTTP.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import APIRouter, Request

from rewardplane.serve.protocol import (
    LIFECYCLE_ACTIONS,
    LIFECYCLE_ROUTE,
    ErrorOut,
    LifecycleActionOut,
    LifecycleRequest,
    LifecycleStateOut,
    ServeError,
    lifecycle_route,
    load_json,
)
from rewardplane.serve.protocol.guards import validate
from rewardplane.serve.routes.context import RouteContext, raw_body

MAX_LIFECYCLE_BODY = 64 * 1024
BODY_MODELS = (LifecycleRequest,)
DESCRIPTIONS = {
    "offload": "Drain, then move the scorers' weights to pinned host memory and free the GPU memory.",
    "onload": "Move the weights back, re-capture CUDA graphs, warm up; or reopen admission after a drain.",
    "drain": "Stop admission (503 draining) and wait for in-flight requests to finish.",
}


def serves_lifecycle(ctx: RouteContext) -> bool:
    return hasattr(ctx.backend, "lifecycle_action")


async def lifecycle_request(request: Request) -> tuple[list[str] | None, float | None]:
    """(scorers, timeout_s) from `?scorer=` (repeatable) and `?timeout_s=`, or the body's
    `LifecycleRequest`; both ways at once is a 422."""
    names = request.query_params.getlist("scorer")
    query_timeout = request.query_params.get("timeout_s")
    body = await request.body()
    if len(body) > MAX_LIFECYCLE_BODY:
        raise ServeError("body_too_large", f"lifecycle body over {MAX_LIFECYCLE_BODY} bytes")
    req = validate(LifecycleRequest, load_json(body)) if body.strip() else LifecycleRequest()
    if names and req.scorers:
        raise ServeError("invalid_request", "give the scorers as ?scorer= or in the body, not both")
    timeout_s = req.timeout_s
    if query_timeout is not None:
        if timeout_s is not None:
            raise ServeError(
                "invalid_request", "give timeout_s as a query parameter or in the body, not both"
            )
        try:
            timeout_s = float(query_timeout)
        except ValueError:
            raise ServeError("invalid_request", f"timeout_s={query_timeout!r} is not a number") from None
    if timeout_s is not None and not (math.isfinite(timeout_s) and timeout_s >= 0):
        raise ServeError("invalid_request", "timeout_s must be a finite number >= 0")
    return (names or req.scorers or None), timeout_s


def lifecycle_router(ctx: RouteContext) -> APIRouter:
    """`POST /v1/lifecycle/{offload,onload,drain}` and `GET /v1/lifecycle`."""
    router = APIRouter()
    backend: Any = ctx.backend
    errors = {code: {"model": ErrorOut} for code in (401, 422, 500, 503)}

    def action_route(action: str):
        async def route(request: Request) -> dict[str, Any]:
            names, timeout_s = await lifecycle_request(request)
            results = await backend.lifecycle_action(action, names, timeout_s)
            return {"action": action, "results": results, "lifecycle": await backend.lifecycle_state()}

        return route

    for action in LIFECYCLE_ACTIONS:
        router.add_api_route(
            lifecycle_route(action),
            action_route(action),
            methods=["POST"],
            name=f"lifecycle_{action}",
            description=DESCRIPTIONS[action],
            response_model=LifecycleActionOut,
            responses=errors,
            openapi_extra=raw_body(LifecycleRequest, required=False),
        )

    @router.get(LIFECYCLE_ROUTE, response_model=LifecycleStateOut, responses={401: {"model": ErrorOut}})
    async def lifecycle_state(request: Request) -> dict[str, Any]:
        """State per scorer, bytes on the GPU, last transition times; the process's GPU memory."""
        return await backend.lifecycle_state()

    return router
