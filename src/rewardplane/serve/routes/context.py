"""What a trainer route borrows from the app: `RouteContext` (docs/integrations.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import Request

from rewardplane.serve.backend import ScoringBackend
from rewardplane.serve.config import Limits
from rewardplane.serve.protocol import ItemError, ScoreItem


@dataclass(frozen=True)
class RouteContext:
    """What a trainer route borrows from the app (`rewardplane.serve.app.create_app`)."""

    backend: ScoringBackend
    limits: Limits
    check_auth: Callable[[Request], None]
    """Raises `ServeError("unauthorized")` unless the request carries the configured token."""
    read_body: Callable[[Request], Awaitable[bytes]]
    """The body, with `max_body_bytes` enforced while streaming."""
    score_all: Callable[[list[str], list[ScoreItem]], Awaitable[dict[str, list[float | ItemError]]]]
    """name → one checked result per item (a finite float or an `ItemError`); whole-request
    failures (`queue_full`, `not_ready`, `timeout`, ...) raise `ServeError`."""
    count: Callable[[str, int, str, float], None]
    """Metrics: (route, status, code, perf_counter at start)."""


def ready_names(ctx: RouteContext, names: list[str]) -> tuple[list[str], list[str]]:
    """(names the service does not host, hosted names not loaded yet)."""
    configured = set(ctx.backend.scorer_names())
    infos = ctx.backend.scorer_infos()
    unknown = [n for n in names if n not in configured]
    loading = [n for n in names if n in configured and n not in infos]
    return unknown, loading
