"""Whole-request errors of the reward service: a stable `code` and the HTTP status it maps to.

Per-item failures (`non_finite`, `scorer_failed`, `bad_image`, ...) are not exceptions: they
travel as `ItemError` values next to the scores, so one bad item never fails its neighbours.
Every code below is documented in docs/serve.md and exercised by tests/test_serve_errors.py.
"""

from __future__ import annotations

from rewardkit.core.errors import RewardkitError

STATUS_BY_CODE: dict[str, int] = {
    "unauthorized": 401,
    "identity_mismatch": 409,
    "body_too_large": 413,
    "too_many_items": 413,
    "image_too_large": 413,
    "invalid_json": 422,
    "invalid_request": 422,
    "unknown_scorer": 422,
    "bad_image": 422,
    "missing_image": 422,
    "queue_full": 429,
    "not_ready": 503,
    "queue_timeout": 504,
    "timeout": 504,
    "internal": 500,
}

# Per-item error codes (inside `results[i].errors[scorer]`), documented alongside the above.
ITEM_ERROR_CODES: tuple[str, ...] = (
    "non_finite",
    "scorer_failed",
    "bad_image",
    "missing_reference",
    "bad_input",
    "too_long",
    "worker_lost",
)


class ServeError(RewardkitError):
    """A whole-request failure. `retry_after` (seconds) becomes a `Retry-After` header."""

    code = "internal"

    def __init__(self, code: str, message: str, *, retry_after: float | None = None) -> None:
        if code not in STATUS_BY_CODE:
            raise ValueError(f"undocumented serve error code {code!r}")
        super().__init__(message, code=code)
        self.retry_after = retry_after

    @property
    def status(self) -> int:
        return STATUS_BY_CODE[self.code]

    def body(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}
