"""The UniRL reward protocol "1" (UniRL's `RemoteRewardBackend`): `POST /score`,
`GET /health`, `GET /rewards`, served by `rewardplane.serve.routes.unirl`
(docs/integrations.md). Its whole-request errors use the `{"code", "message"}` body, with the
codes of `UNIRL_ERROR_CODES` besides the service's own."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, JsonValue

UNIRL_SCORE_ROUTE = "/score"
UNIRL_HEALTH_ROUTE = "/health"
UNIRL_REWARDS_ROUTE = "/rewards"
UNIRL_PROTOCOL_VERSION = "1"
UNIRL_METRIC = "score"
"""The sub-metric every reward reports first, its total: `results[i][reward] = {"score": value}`;
a composite's components follow it under their names (`{"score": total, "correct": 1.0, ...}`)."""

UNIRL_ERROR_CODES: dict[str, int] = {
    "unknown_scorer": 400,  # a required reward the service does not host
    "unsupported_protocol": 400,  # protocol_version other than "1"
    "scorer_version_mismatch": 400,  # a pin that differs, or pins a request with several rewards
    "unsupported_input": 400,  # image_ipc turns, grad_mode
    "idempotency_conflict": 409,  # a known idempotency_key with a different payload
}


class UniRLTurn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    text: str = ""
    image_b64: str | None = None
    image_ipc: str | None = None
    video_b64: str | None = None
    video_path: str | None = None


class UniRLIdentity(BaseModel):
    """Echoed exactly as sent, except `scorer_version`: the scorer's identity."""

    request_id: str | int | None = None
    sample_id: str | int | None = None
    group_id: str | int | None = None
    source_rank: int | None = None
    policy_version: int | None = None
    scorer_version: str | None = None
    idempotency_key: str | None = None


class UniRLRequestItem(UniRLIdentity):
    # One request: what to score (`history`), with which rewards, and the identity to echo.
    # (No docstring: the OpenAPI document describes it as it always has.)
    model_config = ConfigDict(extra="ignore")

    history: list[UniRLTurn] = Field(min_length=1)
    required_rewards: list[str] = Field(min_length=1)
    metadata: dict[str, JsonValue] | None = None
    idempotency_key: str | None = Field(default=None, max_length=512)


class UniRLScoreRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    protocol_version: str = UNIRL_PROTOCOL_VERSION
    requests: list[UniRLRequestItem]
    grad_mode: bool = False


class UniRLScoreResponse(BaseModel):
    protocol_version: str = UNIRL_PROTOCOL_VERSION
    results: list[dict[str, dict[str, float]]]
    errors: list[dict[str, str]]
    error_kinds: list[dict[str, str]] = Field(
        default_factory=list,
        description="an extension beside `errors`: per request, reward -> `item` (the policy's own "
        "failure: penalise) or `service` (mask or retry); docs/serve.md 'Failure kinds'",
    )
    identities: list[UniRLIdentity]


class UniRLHealth(BaseModel):
    status: str = "ok"
    rewards: dict[str, list[str]]


class UniRLRewards(BaseModel):
    rewards: list[str]
