"""`GET /metrics`: the service's Prometheus metrics (`rewardplane.serve.metrics`, docs/serve.md)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from rewardplane.serve.protocol import METRICS_ROUTE, ErrorOut
from rewardplane.serve.routes.context import RouteContext


def metrics_router(ctx: RouteContext) -> APIRouter:
    router = APIRouter()

    @router.get(
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
        return Response(generate_latest(ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return router
