"""The service clients' retry policy (tenacity), shared by `RewardClient`, `AsyncRewardClient` and
its streaming sender.

A 429 or 503 answer and a failed connection (refused, reset, a connect or pool timeout) are
retried up to `max_retries` times, with exponential backoff (`backoff_s` doubling, capped at
`max_backoff_s`, ±50% jitter); a `Retry-After` from the server wins over the computed delay.
Scoring is side-effect free and every retry carries the request's one Idempotency-Key, so a
retry cannot double-count anything. Any other answer is final at once. When the retries are
spent, the last answer is returned (the caller turns an error answer into `ServiceError`) or
the last transport error is raised.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import httpx
import tenacity

RETRY_STATUS = (429, 503)
RETRY_EXCEPTIONS = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.RemoteProtocolError,
    httpx.ReadError,
    httpx.WriteError,
    httpx.PoolTimeout,
)


def _retryable_answer(response: httpx.Response) -> bool:
    return response.status_code in RETRY_STATUS


def _last_outcome(state: tenacity.RetryCallState) -> Any:
    """Retries spent: the last answer as it is, or the last transport error raised again."""
    assert state.outcome is not None
    return state.outcome.result()


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 6
    backoff_s: float = 0.25
    max_backoff_s: float = 30.0

    def delay(self, attempt: int, response: httpx.Response | None) -> float:
        """Seconds before retry `attempt + 1` (`attempt` counts from 0); `response` is the answer
        that is retried, None after a transport error."""
        if response is not None and (retry_after := response.headers.get("retry-after")):
            try:
                return min(self.max_backoff_s, float(retry_after)) + random.random() * self.backoff_s
            except ValueError:
                pass
        return min(self.max_backoff_s, self.backoff_s * 2**attempt) * (0.5 + random.random() / 2)

    def _wait(self, state: tenacity.RetryCallState) -> float:
        outcome = state.outcome
        response = None if outcome is None or outcome.failed else outcome.result()
        return self.delay(state.attempt_number - 1, response)

    def _options(self, **extra: Any) -> dict[str, Any]:
        return {
            "retry": tenacity.retry_if_exception_type(RETRY_EXCEPTIONS)
            | tenacity.retry_if_result(_retryable_answer),
            "stop": tenacity.stop_after_attempt(self.max_retries + 1),
            "wait": self._wait,
            "retry_error_callback": _last_outcome,
            **extra,
        }

    def retrying(self, **extra: Any) -> tenacity.Retrying:
        """`retrying(fn, *args, **kwargs)` calls fn under this policy (blocking sleeps)."""
        return tenacity.Retrying(**self._options(**extra))

    def async_retrying(self, **extra: Any) -> tenacity.AsyncRetrying:
        """`await async_retrying(fn, *args, **kwargs)` for a coroutine function `fn`."""
        return tenacity.AsyncRetrying(**self._options(**extra))
