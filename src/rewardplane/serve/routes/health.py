"""`GET /health/live` and `GET /health/ready`, open without a token (for probes).

Live answers as soon as the process serves HTTP; ready is 503 `not_ready` (with `Retry-After`)
until every scorer is loaded and warmed up, and again if the backend's start failed."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from rewardplane.serve.protocol import LIVE_ROUTE, READY_ROUTE, LiveOut, NotReadyOut, ReadyOut
from rewardplane.serve.routes.context import RouteContext


def health_router(ctx: RouteContext) -> APIRouter:
    router = APIRouter()

    @router.get(LIVE_ROUTE, response_model=LiveOut)
    async def live() -> dict[str, str]:
        return {"status": "ok"}

    @router.get(READY_ROUTE, response_model=ReadyOut, responses={503: {"model": NotReadyOut}})
    async def ready(request: Request) -> JSONResponse:
        ok, details = ctx.backend.ready()
        task = getattr(request.app.state, "start_task", None)  # the app's backend.start()
        if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
            ok, details = False, {**details, "_start": f"failed: {task.exception()!r}"[:300]}
        if ok:
            return JSONResponse({"ready": True, "scorers": details})
        return JSONResponse(
            {"code": "not_ready", "message": "scorers are loading, warming up or broken", "scorers": details},
            status_code=503,
            headers={"Retry-After": "5"},
        )

    return router
