"""Paths and headers of the reward service's own API (docs/serve.md "API").

The trainer protocols' paths sit with their bodies (`openrlhf.py`, `unirl.py`)."""

from __future__ import annotations

from collections.abc import Mapping

SCORE_ROUTE = "/v1/score"
SCORERS_ROUTE = "/v1/scorers"
DEPLOYMENT_ROUTE = "/v1/deployment"  # deploy gateway / Ray backend only (docs/deploy.md)
LIVE_ROUTE = "/health/live"
READY_ROUTE = "/health/ready"
METRICS_ROUTE = "/metrics"
LIFECYCLE_ROUTE = "/v1/lifecycle"  # GET: states; POST .../{offload,onload,drain} (docs/lifecycle.md)
AUDIT_ROUTE = "/v1/audit"  # GET: the audit stream's statistics and alarms (docs/audit.md)
LIFECYCLE_ACTIONS = ("offload", "onload", "drain")


def lifecycle_route(action: str) -> str:
    """`/v1/lifecycle/offload`, `/v1/lifecycle/onload` or `/v1/lifecycle/drain`."""
    return f"{LIFECYCLE_ROUTE}/{action}"


QUEUE_TIME_HEADER = "x-queue-time"
"""Longest wait of any of the request's items before its batch started (ms)."""
INFERENCE_TIME_HEADER = "x-inference-time"
"""Longest batch the request was part of (ms)."""
TOTAL_TIME_HEADER = "x-total-time"
"""Handler time (ms)."""
TIMING_HEADERS = (QUEUE_TIME_HEADER, INFERENCE_TIME_HEADER, TOTAL_TIME_HEADER)
IDEMPOTENCY_KEY_HEADER = "idempotency-key"
"""Sent once per logical request (the same on retries) and echoed back, at most 128 characters."""
MAX_IDEMPOTENCY_KEY = 128
RETRY_AFTER_HEADER = "Retry-After"
MULTIPART_REQUEST_PART = "request"
"""The multipart part that holds the JSON `ScoreRequest`; every other part is an image."""


def timing_headers(*, queue_s: float, inference_s: float, total_s: float) -> dict[str, str]:
    """The three timing headers, in milliseconds with three decimals."""
    return {
        QUEUE_TIME_HEADER: f"{queue_s * 1000:.3f}",
        INFERENCE_TIME_HEADER: f"{inference_s * 1000:.3f}",
        TOTAL_TIME_HEADER: f"{total_s * 1000:.3f}",
    }


def header_ms(headers: Mapping[str, str], name: str) -> float | None:
    """A timing header as a float (ms); None when absent or malformed. `headers` should be
    case-insensitive (httpx / aiohttp headers are)."""
    try:
        return float(headers[name])
    except (KeyError, ValueError, TypeError):
        return None
