"""`GET /v1/audit`: the audit stream's counters, alarms, bins and versions (docs/audit.md).

Without an `audit:` section in the service config it answers 404 `not_found` saying so. `?summary=true` answers the
counters, the alarms and the newest closed bin only (what a trainer callback polls each step);
`?since=V` leaves out bins and versions older than V. The statistics are read in a thread,
so a large snapshot never holds up the event loop.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request

from rewardplane.serve.protocol import AUDIT_ROUTE, ErrorOut
from rewardplane.serve.routes.context import RouteContext


def audit_router(ctx: RouteContext) -> APIRouter:
    router = APIRouter()
    stream = ctx.audit

    @router.get(
        AUDIT_ROUTE,
        responses={
            200: {"description": "counters, alarms, bins and versions (schema rewardplane.audit/1)"},
            401: {"model": ErrorOut},
            404: {"model": ErrorOut, "description": "the service config has no `audit:` section"},
        },
    )
    async def audit(
        request: Request,
        summary: bool = Query(False, description="counters, alarms and the newest closed bin only"),
        since: int | None = Query(None, ge=0, description="leave out bins and versions older than this"),
    ) -> dict[str, Any]:
        if stream is None:
            raise HTTPException(
                404, "this service audits nothing: its config has no `audit:` section (docs/audit.md)"
            )
        return await stream.snapshot(summary=summary, since=since)

    return router
