"""`GET /v1/deployment`: the layout and live state of every worker, for backends that have one
(the deploy gateway, Ray Serve; docs/deploy.md)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request

from rewardplane.serve.protocol import DEPLOYMENT_ROUTE, ErrorOut
from rewardplane.serve.routes.context import RouteContext


def serves_deployment(ctx: RouteContext) -> bool:
    return hasattr(ctx.backend, "deployment")


def deployment_router(ctx: RouteContext) -> APIRouter:
    router = APIRouter()

    @router.get(
        DEPLOYMENT_ROUTE,
        responses={
            200: {"description": "the layout and live state of every worker (docs/deploy.md)"},
            401: {"model": ErrorOut},
        },
    )
    async def deployment(request: Request) -> dict[str, Any]:
        return await asyncio.to_thread(ctx.backend.deployment)  # type: ignore[attr-defined]

    return router
