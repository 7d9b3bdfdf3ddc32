"""A scorer's residency settings (`residency`, `auto_onload`, `idle_offload_s`), checked: when its
weights are on the GPU (docs/lifecycle.md). The service config's scorer spec checks them when it
is read, and `serve/lifecycle.py`'s state machine follows them; this module imports nothing of
the service, so both can."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rewardplane.core.errors import ConfigError

RESIDENCIES = ("resident", "per_call", "on_demand")
PER_CALL_IDLE_S = 1.0


@dataclass(frozen=True)
class LifecyclePolicy:
    """A scorer's `residency`, `auto_onload` and `idle_offload_s` settings, checked."""

    residency: str = "resident"
    auto_onload: bool | None = None
    idle_offload_s: float | None = None

    def __post_init__(self) -> None:
        if self.residency not in RESIDENCIES:
            raise ConfigError(f"residency must be one of {RESIDENCIES}, got {self.residency!r}")
        if self.auto_onload is not None and not isinstance(self.auto_onload, bool):
            raise ConfigError("auto_onload must be true or false")
        if self.residency != "resident" and self.auto_onload is False:
            raise ConfigError(f"residency {self.residency!r} onloads on demand: auto_onload cannot be false")
        if self.idle_offload_s is not None:
            if isinstance(self.idle_offload_s, bool) or not isinstance(self.idle_offload_s, int | float):
                raise ConfigError("idle_offload_s must be a number of seconds or null")
            if not (math.isfinite(self.idle_offload_s) and self.idle_offload_s >= 0):
                raise ConfigError("idle_offload_s must be >= 0")
            if self.residency == "resident":
                raise ConfigError("idle_offload_s needs residency per_call or on_demand")

    @property
    def onloads_on_request(self) -> bool:
        return self.auto_onload if self.auto_onload is not None else self.residency != "resident"

    @property
    def idle_s(self) -> float | None:
        """Seconds without a request after which the scorer offloads itself (None: never)."""
        if self.idle_offload_s is not None:
            return float(self.idle_offload_s)
        return PER_CALL_IDLE_S if self.residency == "per_call" else None


def policy_of(spec: Any) -> LifecyclePolicy:
    """A scorer spec's lifecycle settings (absent keys: the defaults)."""
    return LifecyclePolicy(
        residency=getattr(spec, "residency", "resident"),
        auto_onload=getattr(spec, "auto_onload", None),
        idle_offload_s=getattr(spec, "idle_offload_s", None),
    )
