"""`GET /v1/scorers`: every loaded scorer's `ScorerInfo` (what clients pin) and every configured
scorer's load status."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from rewardplane.serve.protocol import SCORERS_ROUTE, ErrorOut, ScorersResponse, scorer_info_json
from rewardplane.serve.routes.context import RouteContext


def scorers_router(ctx: RouteContext) -> APIRouter:
    router = APIRouter()

    @router.get(
        SCORERS_ROUTE,
        response_model=ScorersResponse,
        response_model_exclude_unset=True,
        responses={401: {"model": ErrorOut}},
    )
    async def scorers(request: Request) -> dict[str, Any]:
        infos = ctx.backend.scorer_infos()
        _, details = ctx.backend.ready()
        return {
            "scorers": [scorer_info_json(infos[n]) for n in ctx.backend.scorer_names() if n in infos],
            "kinds": ctx.kinds,
            "status": details,
        }

    return router
