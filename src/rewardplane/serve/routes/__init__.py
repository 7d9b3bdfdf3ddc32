"""The HTTP routes, one module per route family; `create_app` composes them (docs/serve.md).

Each module builds a FastAPI `APIRouter` from one `RouteContext` (the app's body reader,
metrics and scoring core), so a route is addressable and testable on its own; no route checks
the token (the app's one `RequireToken` middleware guards every route but the probes). A route
that reads its JSON body raw lists the body's model in its `BODY_MODELS`, for the OpenAPI
document.

- `score`: `POST /v1/score`.
- `scorers`: `GET /v1/scorers`.
- `health`: `GET /health/live`, `GET /health/ready`.
- `metrics`: `GET /metrics`.
- `lifecycle`: `/v1/lifecycle` (offload, onload, drain, state), for backends that have one.
- `deployment`: `GET /v1/deployment`, for the deploy gateway and Ray Serve.
- `openrlhf`: `POST /get_reward` (OpenRLHF's `--reward.remote_url`).
- `unirl`: the UniRL reward protocol "1" (`POST /score`, `GET /health`, `GET /rewards`).
- `audit`: `GET /v1/audit`, when the service config has an `audit:` section (docs/audit.md).
"""

from __future__ import annotations

from fastapi import APIRouter

from rewardplane.serve.routes import lifecycle, openrlhf, score, unirl
from rewardplane.serve.routes.audit import audit_router
from rewardplane.serve.routes.context import RouteContext, error_response
from rewardplane.serve.routes.deployment import deployment_router, serves_deployment
from rewardplane.serve.routes.health import health_router
from rewardplane.serve.routes.metrics import metrics_router
from rewardplane.serve.routes.scorers import scorers_router

__all__ = ["BODY_MODELS", "RouteContext", "error_response", "route_paths", "service_routers"]

BODY_MODELS = (*score.BODY_MODELS, *lifecycle.BODY_MODELS, *openrlhf.BODY_MODELS, *unirl.BODY_MODELS)
"""Every body a route reads raw: their schemas go into the OpenAPI document's components."""


def service_routers(ctx: RouteContext) -> list[APIRouter]:
    """Every route family the service answers for `ctx.backend`, in the order the app adds them."""
    routers = [
        score.score_router(ctx),
        openrlhf.openrlhf_router(ctx),  # the trainer protocols (docs/integrations.md)
        unirl.unirl_router(ctx),
        scorers_router(ctx),
    ]
    if serves_deployment(ctx):
        routers.append(deployment_router(ctx))
    if lifecycle.serves_lifecycle(ctx):
        routers.append(lifecycle.lifecycle_router(ctx))
    routers.append(audit_router(ctx))  # without an audit section: a 404 that says so
    return [*routers, health_router(ctx), metrics_router(ctx)]


def route_paths(routers: list[APIRouter]) -> frozenset[str]:
    """Every path the routers answer (each router's routes are its own, none nested)."""
    return frozenset(route.path for router in routers for route in router.routes if hasattr(route, "path"))
