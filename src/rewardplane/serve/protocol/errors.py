"""Error codes of the wire: whole-request codes with their HTTP status, per-item codes,
`ServeError` and the `{"code", "message"}` body (docs/serve.md's tables list exactly these; a
test compares them). A code, once published, keeps its name and meaning."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel

from rewardplane.core.errors import RewardplaneError


class _Code(StrEnum):
    """A code whose members carry what the docs say about them: `(value, [status,] meaning)`."""

    meaning: str

    def __new__(cls, value: str, *details: int | str) -> _Code:
        member = str.__new__(cls, value)
        member._value_ = value
        *status, member.meaning = details
        if status:
            member.status = status[0]
        return member


class RequestErrorCode(_Code):
    """Whole-request error codes: the response is `status` with an `ErrorOut` body."""

    status: int

    UNAUTHORIZED = "unauthorized", 401, "a token is configured and the bearer token is missing or wrong"
    IDENTITY_MISMATCH = "identity_mismatch", 409, "`pin` names an identity the scorer no longer has"
    BODY_TOO_LARGE = "body_too_large", 413, "body over `max_body_bytes`"
    TOO_MANY_ITEMS = "too_many_items", 413, "more than `max_items` items (or multipart parts)"
    TOO_LARGE = "too_large", 413, "more items than a requested scorer's `max_queue` can ever admit"
    IMAGE_TOO_LARGE = "image_too_large", 413, "an image over `max_image_pixels` (whole-request image checks)"
    INVALID_JSON = "invalid_json", 422, "the body (or multipart `request` part) is not JSON"
    INVALID_REQUEST = "invalid_request", 422, "schema violation (types, fields, ids, parts, pins)"
    UNKNOWN_SCORER = "unknown_scorer", 422, "a scorer name the service does not host"
    BAD_IMAGE = "bad_image", 422, "an image's `b64` is not valid base64"
    MISSING_IMAGE = "missing_image", 422, "an image scorer was requested for an item without an image"
    QUEUE_FULL = "queue_full", 429, "the scorer's queue would exceed `max_queue`; see Retry-After"
    NOT_READY = "not_ready", 503, "a requested scorer is loading, failed, or the service is stopping"
    QUEUE_TIMEOUT = "queue_timeout", 504, "an item waited longer than `queue_timeout_s`"
    TIMEOUT = "timeout", 504, "the request took longer than `request_timeout_s`"
    DRAINING = "draining", 503, "the scorer is draining: admission stopped, in-flight work finishing"
    OFFLOADED = "offloaded", 503, "the scorer is offloaded (POST /v1/lifecycle/onload)"
    ONLOAD_FAILED = "onload_failed", 503, "onload found too little GPU memory or failed warm-up"
    DRAIN_TIMEOUT = "drain_timeout", 503, "in-flight work outlasted `timeout_s`; nothing moved"
    OFFLOAD_FAILED = "offload_failed", 500, "moving the weights to host memory failed; they stayed"
    INTERNAL = "internal", 500, "an unexpected server error (a bug)"


STATUS_BY_CODE: dict[str, int] = {code.value: code.status for code in RequestErrorCode}

ROUTE_ERROR_CODES: dict[int, str] = {404: "not_found", 405: "method_not_allowed"}
"""Codes for routing failures, which the framework raises before any handler runs."""
HTTP_ERROR_CODE = "http_error"
"""Any other framework-level HTTP error; clients also use it for a body without a code."""
INVALID_RESPONSE_CODE = "invalid_response"
"""A client's code for a 200 whose body does not answer what was asked (a missing id, a score
that is not a finite number, ...): the service never sends one; a proxy or a bug might."""


class ItemErrorCode(_Code):
    """Per-item error codes, inside `results[i].errors[scorer]`; the request itself succeeds."""

    NON_FINITE = "non_finite", "the scorer produced NaN or ±inf"
    SCORER_FAILED = "scorer_failed", "the scorer raised on this batch or returned a non-number / wrong count"
    BAD_IMAGE = "bad_image", "the image passed admission but failed to decode in the batch"
    MISSING_REFERENCE = "missing_reference", "the scorer needs the item's `reference`"
    BAD_INPUT = (
        "bad_input",
        "an item the scorer cannot use (an empty response, an undecodable or hostile image)",
    )
    TOO_LONG = "too_long", "a text item whose response alone exceeds `max_length` tokens"
    WORKER_LOST = "worker_lost", "(deploy) the worker process holding the item died"
    TIMEOUT = "timeout", "a verifier (math, code, judge) ran past its per-item wall-clock limit"
    MEMORY_LIMIT = "memory_limit", "code under test went over the sandbox's memory limit"
    OUTPUT_LIMIT = "output_limit", "code under test wrote more than the sandbox's output or file limit"
    SANDBOX_ERROR = "sandbox_error", "the code sandbox (local or SandboxFusion) failed, not the code"
    JUDGE_UNPARSEABLE = "judge_unparseable", "the judge's answer had no parseable score, or it refused"
    JUDGE_ERROR = "judge_error", "the judge endpoint failed after its retries, or the deadline passed"
    GROUP_INCOMPLETE = (
        "group_incomplete",
        "group normalisation needs the whole group_id group in one batch, every member scored",
    )


ITEM_ERROR_CODES: tuple[str, ...] = tuple(code.value for code in ItemErrorCode)


class ServeError(RewardplaneError):
    """A whole-request failure: `status` and `body()` are its response; `retry_after` (seconds)
    becomes a `Retry-After` header. Only the codes above exist, so none can go undocumented."""

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
        return error_body(self.code, self.message)


def error_body(code: str, message: str) -> dict[str, str]:
    """`{"code", "message"}`: a whole-request error body, and each per-item error."""
    return {"code": code, "message": message}


class ErrorOut(BaseModel):
    """`{"code", "message"}`: every whole-request error response, and each per-item error."""

    code: str
    message: str
