"""Per-request timing that backends report without changing the `score()` signature.

The app opens a `RequestTiming` in a context variable for each request; whatever backend
serves it (in-process batcher, the deploy gateway) calls `record_timing` with the queue and
inference time it observed, and the app turns the maxima into `x-queue-time` /
`x-inference-time` headers. asyncio tasks copy the context, so concurrent per-scorer calls of
one request all write into the same object.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass


@dataclass
class RequestTiming:
    queue_s: float = 0.0
    inference_s: float = 0.0


current_timing: contextvars.ContextVar[RequestTiming | None] = contextvars.ContextVar(
    "rewardplane_request_timing", default=None
)


def record_timing(*, queue_s: float, inference_s: float) -> None:
    timing = current_timing.get()
    if timing is not None:
        timing.queue_s = max(timing.queue_s, queue_s)
        timing.inference_s = max(timing.inference_s, inference_s)
