"""Error codes of the wire: whole-request codes with their HTTP status, per-item codes with
their kind (whose failure it is), `ServeError` and the `{"code", "message"}` body (docs/serve.md's
tables list exactly these; a test compares them). A code, once published, keeps its name, its
kind and its meaning."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

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


ITEM = "item"
"""A failure kind: the item's own, caused by what the policy wrote (its program looped, crashed
or ran out of memory, its answer is empty, too long, or made the judge answer unreadably). It
must never pay: a composite counts it as the component's lowest score (or fails the item), and
an adapter may penalise it (docs/serve.md "Failure kinds")."""
SERVICE = "service"
"""A failure kind: not the policy's doing (an engine or a sandbox down, a worker lost, a bug, the
request's own data incomplete). A trainer masks the sample or retries; a composite may
renormalise over it."""
FAILURE_KINDS: tuple[str, ...] = (ITEM, SERVICE)


class ItemErrorCode(_Code):
    """Per-item error codes, inside `results[i].errors[scorer]`; the request itself succeeds.
    Each line is `(value, kind, meaning)`: `kind` is `ITEM` or `SERVICE`, whose failure it is."""

    kind: str

    def __new__(cls, value: str, *details: str) -> ItemErrorCode:
        if len(details) != 2 or details[0] not in FAILURE_KINDS:
            raise TypeError(f"ItemErrorCode {value!r}: give (value, ITEM or SERVICE, meaning)")
        member = str.__new__(cls, value)
        member._value_ = value
        member.kind, member.meaning = details
        return member

    NON_FINITE = "non_finite", SERVICE, "the scorer produced NaN or ±inf"
    SCORER_FAILED = (
        "scorer_failed",
        SERVICE,
        "the scorer raised on this batch or returned a non-number / wrong count",
    )
    BAD_IMAGE = "bad_image", ITEM, "the image passed admission but failed to decode in the batch"
    MISSING_REFERENCE = "missing_reference", SERVICE, "the scorer needs the item's `reference`"
    BAD_INPUT = (
        "bad_input",
        ITEM,
        "an item the scorer cannot use (an empty response, an undecodable or hostile image)",
    )
    TOO_LONG = "too_long", ITEM, "a text item whose response alone exceeds `max_length` tokens"
    WORKER_LOST = "worker_lost", SERVICE, "(deploy) the worker process holding the item died"
    TIMEOUT = (
        "timeout",
        ITEM,
        "a verifier (math, code) or a rule (`deadline_s`) ran past its per-item wall-clock limit",
    )
    MEMORY_LIMIT = "memory_limit", ITEM, "code under test went over the sandbox's memory limit"
    OUTPUT_LIMIT = (
        "output_limit",
        ITEM,
        "code under test wrote more than the sandbox's output or file limit",
    )
    SANDBOX_ERROR = (
        "sandbox_error",
        SERVICE,
        "the code sandbox (local or SandboxFusion) failed, not the code",
    )
    UNVERIFIABLE = (
        "unverifiable",
        SERVICE,
        "the item's tests pass the program a value that cannot cross to it as plain data (the data's doing, not the policy's)",
    )
    JUDGE_UNPARSEABLE = (
        "judge_unparseable",
        ITEM,
        "the judge's answer had no single verdict where it belongs, or it refused",
    )
    JUDGE_TRUNCATED = (
        "judge_truncated",
        ITEM,
        "the judge's answer was cut off at `max_tokens` (`finish_reason: length`); never parsed",
    )
    JUDGE_ERROR = (
        "judge_error",
        SERVICE,
        "the judge endpoint failed after its retries, or its per-item deadline passed",
    )
    GROUP_INCOMPLETE = (
        "group_incomplete",
        SERVICE,
        "group normalisation needs the whole group_id group in one batch, every member scored",
    )


ITEM_ERROR_CODES: tuple[str, ...] = tuple(code.value for code in ItemErrorCode)
KIND_BY_CODE: dict[str, str] = {code.value: code.kind for code in ItemErrorCode}


def failure_kind(code: str) -> str:
    """Whose failure an item error is: `ITEM` or `SERVICE`. A code this table does not define (a
    client's own `invalid_response`, a newer server's code) is the service's: a trainer masks it
    rather than penalise the policy for something it may not have done."""
    return KIND_BY_CODE.get(code, SERVICE)


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
    """`{"code", "message"}`: a whole-request error body."""
    return {"code": code, "message": message}


def item_error_body(code: str, message: str) -> dict[str, str]:
    """`{"code", "message", "kind"}`: a per-item error; `kind` (`item` / `service`) is
    `failure_kind(code)`, sent so a trainer needs no copy of this table (older clients read
    `code` and `message` and ignore it)."""
    return {"code": code, "message": message, "kind": failure_kind(code)}


class ErrorOut(BaseModel):
    """`{"code", "message"}`: every whole-request error response."""

    code: str
    message: str


class ItemErrorOut(ErrorOut):
    """`{"code", "message", "kind"}`: each per-item error."""

    kind: str = Field(
        SERVICE,
        description="whose failure: `item` (the policy's own: penalise, never renormalise over it) "
        "or `service` (mask or retry); absent from older servers: derive it from `code`",
    )
