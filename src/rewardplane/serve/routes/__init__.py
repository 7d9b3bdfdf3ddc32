"""Routes that speak RL trainers' own reward protocols (docs/integrations.md).

Each module builds a FastAPI `APIRouter` from a `RouteContext`: the app's own auth check, body
reader, metrics counter and scoring core, so a trainer's route applies exactly the checks and
the non-finite guard of `POST /v1/score` and differs only in its wire format
(`rewardplane.serve.protocol`, the sections named after each trainer).

- `openrlhf`: `POST /get_reward` (OpenRLHF's `--remote_rm_url`).
- `gateway`: the reward-gateway protocol "1" (`POST /score`, `GET /health`, `GET /rewards`).
"""

from __future__ import annotations

from fastapi import APIRouter

from rewardplane.serve.routes.context import RouteContext
from rewardplane.serve.routes.gateway import gateway_router
from rewardplane.serve.routes.openrlhf import openrlhf_router

__all__ = ["RouteContext", "trainer_routes"]


def trainer_routes(ctx: RouteContext) -> APIRouter:
    """Every trainer protocol's routes, for one `app.include_router` line in the app."""
    router = APIRouter()
    router.include_router(openrlhf_router(ctx))
    router.include_router(gateway_router(ctx))
    return router
