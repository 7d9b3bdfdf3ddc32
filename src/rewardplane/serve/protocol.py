"""The reward service's wire format, defined once (docs/serve.md "API").

Why one module: the HTTP app, the Python client, the deploy gateway and its worker transport,
and the load generator all speak this format. When each kept its own copy, a field added on
one side (an item's `reference`) was silently dropped by another. Everything that crosses a
process boundary is declared here and imported by every side:

1. Routes and headers: paths, the timing / idempotency / retry headers.
2. Error codes: whole-request codes with their HTTP status, per-item codes, `ServeError`.
3. Bodies: one pydantic model per JSON body (request and response), grouped by route.
4. Item codec: `ScoreItem` ⇄ wire JSON, with images as base64, as multipart parts, or (deploy
   transport) as references into a frame body.
5. Response codec: `ScoreItem` results → the `POST /v1/score` answer.

Adding a route: its path in section 1, its bodies in section 3 under a heading of their own,
any new codes in section 2. Adding an item field: `ItemIn`, `ScoreItem`, `item_fields`,
`item_from_fields` and `ItemIn.to_score_item` (tests/serve/test_protocol.py checks they agree).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import StrEnum
from itertools import chain, compress, repeat
from operator import not_
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter, ValidationError

from rewardplane.core.errors import RewardplaneError
from rewardplane.serve.scorers.base import DetailedScore, ItemError, ScoreItem

# ------------------------------------------------------------------------- 1. routes and headers

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


# ------------------------------------------------------------------------------ 2. error codes


class RequestErrorCode(StrEnum):
    """Whole-request error codes: the response is `status` with an `ErrorOut` body."""

    status: int
    meaning: str

    def __new__(cls, value: str, status: int, meaning: str) -> RequestErrorCode:
        member = str.__new__(cls, value)
        member._value_ = value
        member.status = status
        member.meaning = meaning
        return member

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


class ItemErrorCode(StrEnum):
    """Per-item error codes, inside `results[i].errors[scorer]`; the request itself succeeds."""

    meaning: str

    def __new__(cls, value: str, meaning: str) -> ItemErrorCode:
        member = str.__new__(cls, value)
        member._value_ = value
        member.meaning = meaning
        return member

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


# ------------------------------------------------------------------------------------ 3. bodies


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# --- POST /v1/score: request


class MessageIn(_Strict):
    role: str
    content: str


class ImageIn(_Strict):
    b64: str | None = Field(default=None, description="base64 of the encoded image bytes (JPEG/PNG/WebP)")
    part: str | None = Field(default=None, description="name of a multipart file part holding the bytes")


class ItemIn(_Strict):
    id: str = Field(min_length=1, max_length=512)
    prompt: str | list[MessageIn] = ""
    response: str | list[MessageIn] = ""
    image: ImageIn | None = None
    reference: JsonValue = Field(
        default=None, description="reference answer for verifier/rule scorers: a string or any JSON value"
    )
    group_id: str | None = Field(
        default=None, max_length=512, description="items of one group (e.g. GRPO samples of a prompt)"
    )
    metadata: dict[str, JsonValue] | None = Field(
        default=None, description="free-form JSON object passed to scorers unchanged"
    )

    def to_score_item(self, image: bytes | None) -> ScoreItem:
        return ScoreItem(
            id=self.id,
            prompt=_messages(self.prompt),
            response=_messages(self.response),
            image=image,
            reference=self.reference,
            group_id=self.group_id,
            metadata=self.metadata,
        )


MAX_NAME_CHARS = 128
"""Longest scorer name a request may carry (in `scorers` and as a `pin` key)."""
MAX_SCORERS_PER_REQUEST = 64
MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays/objects in a request body; deeper is 422 `invalid_request`."""

ScorerName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]


class ScoreRequest(_Strict):
    scorers: list[ScorerName] = Field(min_length=1, max_length=MAX_SCORERS_PER_REQUEST)
    items: list[ItemIn]
    pin: dict[ScorerName, Annotated[str, Field(max_length=MAX_NAME_CHARS)]] = Field(
        default_factory=dict,
        max_length=MAX_SCORERS_PER_REQUEST,
        description="scorer name -> identity; mismatch is 409",
    )


# --- POST /v1/score: response


class ErrorOut(BaseModel):
    """`{"code", "message"}`: every whole-request error response, and each per-item error."""

    code: str
    message: str


class ItemOut(BaseModel):
    id: str
    scores: dict[str, float]
    errors: dict[str, ErrorOut]
    details: dict[str, dict[str, JsonValue]] | None = Field(
        default=None,
        description="scorer -> what its score leaves unsaid for this item (a composite's `left_out`); "
        "absent when no scorer has any",
    )


class ScorerRef(BaseModel):
    version: str
    identity: str


class ScoreResponse(BaseModel):
    results: list[ItemOut]
    scorers: dict[str, ScorerRef]


# --- GET /v1/scorers


class ScorerOut(BaseModel):
    name: str
    kind: str
    modality: str
    dtype: str
    device: str
    version: str
    identity: str
    max_batch_size: int
    max_wait_ms: float
    extra: dict[str, Any] | None = Field(default=None, description="kind-specific details; absent if none")


class ScorersResponse(BaseModel):
    scorers: list[ScorerOut]
    status: dict[str, Any] = Field(description="every configured scorer's load status")


# --- health


class LiveOut(BaseModel):
    status: str = "ok"


class ReadyOut(BaseModel):
    ready: bool
    scorers: dict[str, Any]


class NotReadyOut(ErrorOut):
    scorers: dict[str, Any]


# --- /v1/lifecycle: offload, onload, drain, state (docs/lifecycle.md)


class LifecycleRequest(_Strict):
    """Body of `POST /v1/lifecycle/{offload,onload,drain}`; `?scorer=NAME` (repeatable) and
    `?timeout_s=` say the same in the query. No scorers: every scorer of the server."""

    scorers: list[str] | None = Field(default=None, description="scorer names; absent or null: all")
    timeout_s: float | None = Field(default=None, description="drain timeout in seconds (default 30)")


class LifecycleResult(BaseModel):
    """One scorer's answer to an action. `changed: false`: it was already there (a no-op)."""

    action: str
    changed: bool
    state: str
    transfer: dict[str, JsonValue] | None = Field(default=None, description="bytes, seconds, gbps moved")
    ready_seconds: float | None = Field(default=None, description="onload: weights back + warm-up")
    drained: bool | None = None
    in_flight: int | None = None
    replicas: dict[str, LifecycleResult] | None = Field(
        default=None, description="--backend ray: each replica's own result, by replica id"
    )


class ScorerLifecycleOut(BaseModel):
    state: str = Field(
        description="resident | draining | offloading | offloaded | onloading"
        " (--backend ray: mixed when its replicas differ)"
    )
    residency: str
    auto_onload: bool
    idle_offload_s: float | None
    in_flight: int
    bytes_on_device: int
    bytes_total: int
    since: float = Field(description="unix time the current state was entered")
    last_transition: dict[str, float] = Field(description="state -> unix time it was last entered")
    transitions: int
    last_offload: dict[str, JsonValue] | None
    last_onload: dict[str, JsonValue] | None
    last_error: str | None
    replicas: dict[str, ScorerLifecycleOut] | None = Field(
        default=None, description="--backend ray: each replica's own state, by replica id"
    )


class LifecycleStateOut(BaseModel):
    """`GET /v1/lifecycle`: every scorer, and the GPU memory of each serving process."""

    scorers: dict[str, ScorerLifecycleOut]
    processes: dict[str, dict[str, JsonValue]]


class LifecycleActionOut(BaseModel):
    action: str
    results: dict[str, LifecycleResult]
    lifecycle: LifecycleStateOut


# ------------------------------------------------------------------------------- 4. item codec


def _messages(value: str | list[MessageIn]) -> str | list[dict[str, str]]:
    return value if isinstance(value, str) else [{"role": m.role, "content": m.content} for m in value]


def item_fields(item: ScoreItem) -> dict[str, Any]:
    """An item's JSON fields without its image; optional fields only when set."""
    out: dict[str, Any] = {"id": item.id, "prompt": item.prompt, "response": item.response}
    if item.reference is not None:
        out["reference"] = item.reference
    if item.group_id is not None:
        out["group_id"] = item.group_id
    if item.metadata is not None:
        out["metadata"] = item.metadata
    return out


def item_from_fields(entry: Mapping[str, Any], image: bytes | None) -> ScoreItem:
    """The inverse of `item_fields`, for JSON this service wrote itself (the deploy transport):
    no schema check, which the HTTP front already made."""
    return ScoreItem(
        id=str(entry.get("id")),
        prompt=entry.get("prompt"),
        response=entry.get("response"),
        image=image,
        reference=entry.get("reference"),
        group_id=entry.get("group_id"),
        metadata=entry.get("metadata"),
    )


def _b64(data: bytes) -> dict[str, str]:
    return {"b64": base64.b64encode(data).decode("ascii")}


def item_to_wire(item: ScoreItem | Mapping[str, Any]) -> dict[str, Any]:
    """One `ItemIn` as JSON, image as base64. A mapping is sent as given, except raw image bytes."""
    if isinstance(item, ScoreItem):
        out = item_fields(item)
        if item.image is not None:
            out["image"] = _b64(item.image)
        return out
    out = dict(item)
    if isinstance(out.get("image"), bytes | bytearray):
        out["image"] = _b64(bytes(out["image"]))
    return out


def encode_score_request(
    items: Iterable[ScoreItem | Mapping[str, Any]],
    scorers: Sequence[str],
    pin: Mapping[str, str] | None = None,
    *,
    multipart: bool = False,
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(the `ScoreRequest` JSON, image parts). With `multipart`, every base64 image becomes a
    part `image<n>` referred to as `{"part": "image<n>"}`; otherwise parts is empty."""
    payload: dict[str, Any] = {"scorers": list(scorers), "items": [item_to_wire(i) for i in items]}
    if pin:
        payload["pin"] = dict(pin)
    parts: dict[str, bytes] = {}
    if multipart:
        for n, entry in enumerate(payload["items"]):
            image = entry.get("image")
            if isinstance(image, dict) and "b64" in image:
                name = f"image{n}"
                parts[name] = base64.b64decode(image["b64"])
                entry["image"] = {"part": name}
    return payload, parts


def join_score_request(scorers: Sequence[str], encoded_items: Iterable[bytes]) -> bytes:
    """A JSON `ScoreRequest` body from items already JSON-encoded (`item_to_wire` + json.dumps),
    so a load generator encodes each item once, not once per request."""
    return (
        b'{"scorers":' + json.dumps(list(scorers)).encode() + b',"items":[' + b",".join(encoded_items) + b"]}"
    )


MAX_MESSAGE_CHARS = 300
"""Error messages are cut here, so a hostile field never comes back at full size."""


def _first_error(exc: ValidationError) -> str:
    e = exc.errors(include_url=False, include_input=False)[0]
    return _where(list(e.get("loc", ())), e.get("msg", "invalid"))


def _where(loc: list[Any], msg: str) -> str:
    parts = [str(p) for p in loc]
    where = ".".join(parts if len(parts) <= 8 else [*parts[:4], "…", *parts[-3:]]) or "body"
    return f"{where[:120]}: {msg}"[:MAX_MESSAGE_CHARS]


class _NonFinite(ValueError):
    pass


def _no_constants(name: str) -> None:
    raise _NonFinite(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses to inf
        raise _NonFinite(f"{text[:40]} (not a finite number)")
    return value


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # A Python hook (not the C default) on purpose: it runs bytecode once per JSON object, where
    # the interpreter can hand the GIL to the event loop, so parsing a large body in a thread
    # does not stall every other request for the whole parse (docs/reliability.md, fairness).
    return dict(pairs)


DEPTH_CHUNK = 1024
"""Containers `json_depth_exceeds` takes per step: between steps the GIL can pass."""


def json_depth_exceeds(data: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when arrays/objects nest deeper than `limit` (iterative: no recursion to exhaust).

    Walked one nesting level at a time, each level's containers in chunks of `DEPTH_CHUNK`, with
    the per-node work (type tests, collecting children) in C (`map`, `itertools.compress`): a
    body's cost is a few C passes over its nodes, not Python bytecode per container."""
    level = [data] if isinstance(data, dict | list) else []
    depth = 1
    while level:
        if depth > limit:
            return True
        deeper: list[Any] = []
        for start in range(0, len(level), DEPTH_CHUNK):
            chunk = level[start : start + DEPTH_CHUNK]
            dicts = list(map(isinstance, chunk, repeat(dict)))
            children = [
                *chain.from_iterable(map(dict.values, compress(chunk, dicts))),
                *chain.from_iterable(compress(chunk, map(not_, dicts))),
            ]
            deeper += compress(children, map(isinstance, children, repeat(dict | list)))
        level = deeper
        depth += 1
    return False


class _RequestHead(_Strict):
    """`ScoreRequest` with its items left unvalidated: they are validated in chunks."""

    scorers: list[ScorerName] = Field(min_length=1, max_length=MAX_SCORERS_PER_REQUEST)
    items: list[Any]
    pin: dict[ScorerName, Annotated[str, Field(max_length=MAX_NAME_CHARS)]] = Field(
        default_factory=dict, max_length=MAX_SCORERS_PER_REQUEST
    )


VALIDATE_CHUNK = 32
"""Items validated per call: between calls the GIL can pass to the event loop."""
_ITEMS = TypeAdapter(list[ItemIn])


def parse_score_request(raw: bytes | str, *, max_items: int | None = None) -> ScoreRequest:
    """JSON text → `ScoreRequest`; 422 `invalid_json` / `invalid_request` otherwise.

    NaN and ±Infinity (which Python's json accepts but JSON does not have), numbers that
    overflow to infinity, integers over Python's 4,300-digit limit and nesting deeper than
    `MAX_JSON_DEPTH` are refused (422 `invalid_request`), so free-form fields (`reference`,
    `metadata`) can always be re-encoded for the deploy workers and never reach a 500.
    """
    try:
        data = json.loads(
            raw, parse_constant=_no_constants, parse_float=_finite_float, object_pairs_hook=_object
        )
    except _NonFinite as exc:
        raise ServeError("invalid_request", f"{exc} is not a JSON value"[:MAX_MESSAGE_CHARS]) from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ServeError("invalid_json", f"body is not valid JSON: {exc}"[:MAX_MESSAGE_CHARS]) from None
    except ValueError as exc:  # an integer over the interpreter's digit limit
        raise ServeError("invalid_request", f"a number in the body is too large: {exc}"[:120]) from None
    if isinstance(data, dict | list) and json_depth_exceeds(data):
        raise ServeError(
            "invalid_request", f"the body nests arrays/objects deeper than {MAX_JSON_DEPTH} levels"
        )
    try:
        head = _RequestHead.model_validate(data)
        if max_items is not None and len(head.items) > max_items:  # before validating them all
            raise ServeError("too_many_items", f"{len(head.items)} items exceed the limit of {max_items}")
        items: list[ItemIn] = []
        for start in range(0, len(head.items), VALIDATE_CHUNK):
            try:
                items += _ITEMS.validate_python(head.items[start : start + VALIDATE_CHUNK], strict=True)
            except ValidationError as exc:
                e = exc.errors(include_url=False, include_input=False)[0]
                loc = list(e.get("loc", ()))
                if loc and isinstance(loc[0], int):
                    loc[0] += start
                raise ServeError(
                    "invalid_request", _where(["items", *loc], e.get("msg", "invalid"))
                ) from None
        return ScoreRequest.model_construct(scorers=head.scorers, items=items, pin=head.pin)
    except (ValidationError, RecursionError) as exc:
        message = _first_error(exc) if isinstance(exc, ValidationError) else "the body nests too deeply"
        raise ServeError("invalid_request", message) from None


def items_from_request(
    req: ScoreRequest,
    parts: Mapping[str, bytes],
    *,
    needs_image: bool = False,
    check_image: Callable[[bytes, str], None] | None = None,
) -> list[ScoreItem]:
    """The request's items as `ScoreItem`s, images resolved from base64 or multipart parts.

    Raises `ServeError` for duplicate ids, an image with neither or both of b64/part, bad
    base64, an unknown part, and (with `needs_image`) an item without an image.
    `check_image(data, where)` runs on each image as it is resolved (size limits, headers).
    """
    seen: set[str] = set()
    items = []
    for i, item in enumerate(req.items):
        if item.id in seen:
            raise ServeError("invalid_request", f"items[{i}].id {item.id!r} is duplicated")
        seen.add(item.id)
        image = None
        if item.image is not None:
            if (item.image.b64 is None) == (item.image.part is None):
                raise ServeError("invalid_request", f"items[{i}].image needs exactly one of b64 or part")
            if item.image.b64 is not None:
                try:
                    image = base64.b64decode(item.image.b64, validate=True)
                except (binascii.Error, ValueError):
                    raise ServeError("bad_image", f"items[{i}].image.b64 is not valid base64") from None
            else:
                if item.image.part not in parts:
                    raise ServeError(
                        "invalid_request", f"items[{i}].image.part {item.image.part!r} not in body"
                    )
                image = parts[item.image.part]
            if check_image is not None:
                check_image(image, f"items[{i}].image")
        elif needs_image:
            raise ServeError("missing_image", f"items[{i}] has no image but an image scorer was requested")
        items.append(item.to_score_item(image))
    return items


# --------------------------------------------------------------------------- 5. response codec


def score_response(
    items: Sequence[ScoreItem],
    by_scorer: Mapping[str, Sequence[float | ItemError]],
    refs: Mapping[str, tuple[str, str]],
) -> dict[str, Any]:
    """The `ScoreResponse` JSON: per item, each scorer in `scores` (a float) or `errors`, never
    both, and a scorer's `DetailedScore.detail` under `details` (the key only when some scorer
    has one, so clients that predate it see the same bodies). `by_scorer` holds one checked
    result per item; `refs` is name → (version, identity)."""
    results = []
    for i, item in enumerate(items):
        scores: dict[str, float] = {}
        errors: dict[str, dict[str, str]] = {}
        details: dict[str, dict[str, Any]] = {}
        for name, values in by_scorer.items():
            r = values[i]
            if isinstance(r, ItemError):
                errors[name] = error_body(r.code, r.message)
            else:
                scores[name] = float(r)
                if isinstance(r, DetailedScore) and r.detail:
                    details[name] = r.detail
        result: dict[str, Any] = {"id": item.id, "scores": scores, "errors": errors}
        if details:
            result["details"] = details
        results.append(result)
    scorers = {n: {"version": version, "identity": identity} for n, (version, identity) in refs.items()}
    return {"results": results, "scorers": scorers}


# ------------------------------------------------- 6. trainer protocols (docs/integrations.md)
# Wire formats of RL trainers' own reward clients, served by rewardplane.serve.routes. Their
# whole-request errors use the `{"code", "message"}` body; codes below are their own.

# --- OpenRLHF remote reward model: POST /get_reward (OpenRLHF 0.11 `--remote_rm_url`)

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
    extra_logs: dict[str, list[float]] = Field(description="the scorer's score under its name")


# --- reward-gateway protocol "1": POST /score, GET /health, GET /rewards (UniRL's RemoteRewardBackend)

GATEWAY_SCORE_ROUTE = "/score"
GATEWAY_HEALTH_ROUTE = "/health"
GATEWAY_REWARDS_ROUTE = "/rewards"
GATEWAY_PROTOCOL_VERSION = "1"
GATEWAY_METRIC = "score"
"""The one sub-metric each reward reports: `results[i][reward] = {"score": value}`."""

GATEWAY_ERROR_CODES: dict[str, int] = {
    "unknown_scorer": 400,  # a required reward the service does not host
    "unsupported_protocol": 400,  # protocol_version other than "1"
    "scorer_version_mismatch": 400,  # a pin that differs, or pins a request with several rewards
    "unsupported_input": 400,  # image_ipc turns, grad_mode
    "idempotency_conflict": 409,  # a known idempotency_key with a different payload
}


class GatewayTurn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    text: str = ""
    image_b64: str | None = None
    image_ipc: str | None = None
    video_b64: str | None = None
    video_path: str | None = None


class GatewayRequestItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    history: list[GatewayTurn] = Field(min_length=1)
    required_rewards: list[str] = Field(min_length=1)
    metadata: dict[str, JsonValue] | None = None
    request_id: str | int | None = None
    sample_id: str | int | None = None
    group_id: str | int | None = None
    source_rank: int | None = None
    policy_version: int | None = None
    scorer_version: str | None = None
    idempotency_key: str | None = Field(default=None, max_length=512)


class GatewayScoreRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    protocol_version: str = GATEWAY_PROTOCOL_VERSION
    requests: list[GatewayRequestItem]
    grad_mode: bool = False


class GatewayIdentity(BaseModel):
    """Echoed exactly as sent, except `scorer_version`: the scorer's identity."""

    request_id: str | int | None = None
    sample_id: str | int | None = None
    group_id: str | int | None = None
    source_rank: int | None = None
    policy_version: int | None = None
    scorer_version: str | None = None
    idempotency_key: str | None = None


class GatewayScoreResponse(BaseModel):
    protocol_version: str = GATEWAY_PROTOCOL_VERSION
    results: list[dict[str, dict[str, float]]]
    errors: list[dict[str, str]]
    identities: list[GatewayIdentity]


class GatewayHealth(BaseModel):
    status: str = "ok"
    rewards: dict[str, list[str]]


class GatewayRewards(BaseModel):
    rewards: list[str]


def parse_trainer_body(raw: bytes | str, model: type[BaseModel]) -> Any:
    """A trainer protocol's JSON body → `model`, with the same refusals as `parse_score_request`
    (NaN/Infinity, overflowing numbers, over-long integers, deep nesting: 422, never a 500)."""
    try:
        data = json.loads(raw, parse_constant=_no_constants, parse_float=_finite_float)
    except _NonFinite as exc:
        raise ServeError("invalid_request", f"{exc} is not a JSON value"[:MAX_MESSAGE_CHARS]) from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ServeError("invalid_json", f"body is not valid JSON: {exc}"[:MAX_MESSAGE_CHARS]) from None
    except ValueError as exc:
        raise ServeError("invalid_request", f"a number in the body is too large: {exc}"[:120]) from None
    if json_depth_exceeds(data):
        raise ServeError(
            "invalid_request", f"the body nests arrays/objects deeper than {MAX_JSON_DEPTH} levels"
        )
    try:
        return model.model_validate(data)
    except (ValidationError, RecursionError) as exc:
        message = _first_error(exc) if isinstance(exc, ValidationError) else "the body nests too deeply"
        raise ServeError("invalid_request", message) from None
