"""OpenRLHF's remote reward model wire format: `POST /get_reward` (OpenRLHF 0.11
`--reward.remote_url`, `--remote_rm_url` before 0.11), served by `rewardplane.serve.routes.openrlhf` (docs/integrations.md). Its
whole-request errors use the `{"code", "message"}` body."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, JsonValue

OPENRLHF_ROUTE = "/get_reward"
OPENRLHF_MODES = ("raw", "split")
"""`?mode=`: score the query as given (`raw`), or split it at its prompt and re-render (`split`)."""


class OpenRLHFRewardRequest(BaseModel):
    """OpenRLHF's body; fields it may add later are ignored."""

    model_config = ConfigDict(extra="ignore", strict=True)

    query: list[str] = Field(description="prompt + response as decoded by the policy's tokenizer")
    prompts: list[str] | None = None
    labels: list[JsonValue] | None = None


class OpenRLHFRewardResponse(BaseModel):
    rewards: list[float]
    scores: list[float]
    extra_logs: dict[str, list[float]] = Field(
        description="the scorer's score under its name; a composite's components as `<name>/<component>` "
        "(under on_failure renormalize: `<name>/left_out`, the components left out of each reward)"
    )
