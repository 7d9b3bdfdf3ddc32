"""A scorer's residency settings (`residency`, `auto_onload`, `idle_offload_s`): when its weights
are on the GPU (docs/lifecycle.md). Typed once, here: the service config's `ScorerSpec` is a
`LifecyclePolicy` (it inherits these fields, their checks and their docs), and the state machine
of `serve/lifecycle.py` follows the policy derived from the spec (`policy_of`). This module
imports nothing of the service, so the spec and the lifecycle can both build on it."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from rewardplane.core.config import ConfigModel

RESIDENCIES = ("resident", "per_call", "on_demand")
PER_CALL_IDLE_S = 1.0


class LifecyclePolicy(ConfigModel):
    """A scorer's residency settings, checked when read (a bad one is a `ConfigError` naming the
    key, in a service config at the scorer's dotted key)."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    residency: Literal["resident", "per_call", "on_demand"] = "resident"
    """When the weights are on the GPU (docs/lifecycle.md): `resident` until told to move,
    `per_call` only while requests come, `on_demand` from the first request on."""
    auto_onload: bool | None = None
    """A request that finds the scorer offloaded onloads it (default: only per_call/on_demand)."""
    idle_offload_s: float | None = Field(None, ge=0, allow_inf_nan=False)
    """per_call / on_demand: offload after this long without a request (per_call default 1 s)."""

    @model_validator(mode="after")
    def _consistent(self) -> LifecyclePolicy:
        if self.residency != "resident" and self.auto_onload is False:
            raise ValueError(f"residency {self.residency!r} onloads on demand: auto_onload cannot be false")
        if self.idle_offload_s is not None and self.residency == "resident":
            raise ValueError("idle_offload_s needs residency per_call or on_demand")
        return self

    @property
    def onloads_on_request(self) -> bool:
        return self.auto_onload if self.auto_onload is not None else self.residency != "resident"

    @property
    def idle_s(self) -> float | None:
        """Seconds without a request after which the scorer offloads itself (None: never)."""
        if self.idle_offload_s is not None:
            return float(self.idle_offload_s)
        return PER_CALL_IDLE_S if self.residency == "per_call" else None


def policy_of(spec: LifecyclePolicy) -> LifecyclePolicy:
    """The policy part of a typed spec (a `ScorerSpec` is one): its residency fields alone."""
    return LifecyclePolicy(**{name: getattr(spec, name) for name in LifecyclePolicy.model_fields})
