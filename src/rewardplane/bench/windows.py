"""Measurement windows and the stability rule (perf_analyzer's).

A load point is measured as consecutive fixed-length windows. It is accepted when the last
`stable_windows` windows agree: max/min of their throughput and of their p95 latency both
within `1 + tolerance`. At most `max_windows` are taken; a point that never settles is
reported with `stable: false` rather than dropped, because an unstable service is itself a
finding. Requests are assigned to the window in which they complete.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class WindowPolicy:
    window_s: float = 5.0
    stable_windows: int = 3
    tolerance: float = 0.10
    max_windows: int = 10

    def __post_init__(self) -> None:
        if self.window_s <= 0:
            raise ValueError("window_s must be > 0")
        if not 1 <= self.stable_windows <= self.max_windows:
            raise ValueError("need 1 <= stable_windows <= max_windows")
        if self.tolerance < 0:
            raise ValueError("tolerance must be >= 0")


@dataclass(frozen=True)
class Window:
    start: float
    end: float
    requests: int
    items: int
    p95_ms: float | None

    @property
    def items_per_s(self) -> float:
        return self.items / (self.end - self.start)

    def to_json(self, origin: float) -> dict[str, Any]:
        out = asdict(self)
        out["start"], out["end"] = round(self.start - origin, 6), round(self.end - origin, 6)
        out["items_per_s"] = self.items_per_s
        return out


def make_window(start: float, end: float, completed: Sequence[tuple[int, float]]) -> Window:
    """`completed` is (items, latency_ms) of the successful requests that ended in [start, end)."""
    latencies = [lat for _, lat in completed]
    p95 = float(np.percentile(latencies, 95)) if latencies else None
    return Window(start, end, len(completed), sum(n for n, _ in completed), p95)


def _within(values: list[float], tolerance: float) -> bool:
    low, high = min(values), max(values)
    return low > 0 and high / low <= 1.0 + tolerance


def is_stable(windows: Sequence[Window], policy: WindowPolicy) -> bool:
    recent = list(windows[-policy.stable_windows :])
    if len(recent) < policy.stable_windows or any(w.requests == 0 for w in recent):
        return False
    p95s = [w.p95_ms for w in recent if w.p95_ms is not None]
    return _within([w.items_per_s for w in recent], policy.tolerance) and _within(p95s, policy.tolerance)
