"""The service's own wire format: `POST /v1/score`, `GET /v1/scorers`, health and
`/v1/lifecycle` bodies, the request parser and the response codec (docs/serve.md "API").

A request's items are `ItemIn`s (`codec.py`, derived from `ScoreItem`). A response is encoded
once (`score_response`) and decoded once (`decode_score_response`), by the client and the load
generator alike, so a field the server adds reaches both.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, get_type_hints

from pydantic import BaseModel, Field, JsonValue, TypeAdapter, ValidationError, create_model

from rewardplane.serve.protocol.codec import ItemIn, image_bytes
from rewardplane.serve.protocol.errors import (
    HTTP_ERROR_CODE,
    INVALID_RESPONSE_CODE,
    ErrorOut,
    ItemErrorOut,
    ServeError,
    failure_kind,
    item_error_body,
)
from rewardplane.serve.protocol.guards import (
    Strict,
    first_error,
    load_json,
    validate,
    yielding_object,
)
from rewardplane.serve.protocol.items import (
    COMPONENT_ERRORS,
    COMPONENTS,
    DetailedScore,
    ItemError,
    ScoreItem,
    ScorerInfo,
)

# --- POST /v1/score: request

MAX_NAME_CHARS = 128
"""Longest scorer name a request may carry (in `scorers` and as a `pin` key)."""
MAX_SCORERS_PER_REQUEST = 64

ScorerName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
Pins = dict[ScorerName, Annotated[str, Field(max_length=MAX_NAME_CHARS)]]


class ScoreRequest(Strict):
    scorers: list[ScorerName] = Field(min_length=1, max_length=MAX_SCORERS_PER_REQUEST)
    items: list[ItemIn]
    pin: Pins = Field(
        default_factory=dict,
        max_length=MAX_SCORERS_PER_REQUEST,
        description="scorer name -> identity; mismatch is 409",
    )


class _RequestHead(Strict):
    """`ScoreRequest` with its items left unvalidated: they are validated in chunks."""

    scorers: list[ScorerName] = Field(min_length=1, max_length=MAX_SCORERS_PER_REQUEST)
    items: list[Any]
    pin: Pins = Field(default_factory=dict, max_length=MAX_SCORERS_PER_REQUEST)


VALIDATE_CHUNK = 32
"""Items validated per call: between calls the GIL can pass to the event loop."""
_ITEMS = TypeAdapter(list[ItemIn])


def parse_score_request(raw: bytes | str, *, max_items: int | None = None) -> ScoreRequest:
    """JSON text → `ScoreRequest`; 422 `invalid_json` / `invalid_request` otherwise (the JSON
    guards of `guards.py`), 413 `too_many_items` before the items are validated."""
    head = validate(_RequestHead, load_json(raw, object_pairs_hook=yielding_object))
    if max_items is not None and len(head.items) > max_items:  # before validating them all
        raise ServeError("too_many_items", f"{len(head.items)} items exceed the limit of {max_items}")
    items: list[Any] = []
    for start in range(0, len(head.items), VALIDATE_CHUNK):
        try:
            items += _ITEMS.validate_python(head.items[start : start + VALIDATE_CHUNK], strict=True)
        except ValidationError as exc:
            raise ServeError("invalid_request", first_error(exc, ("items",), start)) from None
        except RecursionError:
            raise ServeError("invalid_request", "the body nests too deeply") from None
    return ScoreRequest.model_construct(scorers=head.scorers, items=items, pin=head.pin)


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
            image = image_bytes(item.image, parts, f"items[{i}].image")
            if check_image is not None:
                check_image(image, f"items[{i}].image")
        elif needs_image:
            raise ServeError("missing_image", f"items[{i}] has no image but an image scorer was requested")
        items.append(item.to_score_item(image))
    return items


# --- POST /v1/score: response


class ItemOut(BaseModel):
    id: str
    scores: dict[str, float]
    errors: dict[str, ItemErrorOut]
    details: dict[str, dict[str, JsonValue]] | None = Field(
        default=None,
        description="scorer -> what its score leaves unsaid for this item: a composite's "
        "`components` (each component's score), `left_out` and `component_errors`; absent when no "
        "scorer has any",
    )


class ScorerRef(BaseModel):
    version: str
    identity: str


class ScoreResponse(BaseModel):
    results: list[ItemOut]
    scorers: dict[str, ScorerRef]


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
                errors[name] = item_error_body(r.code, r.message)
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


@dataclass(frozen=True)
class ItemScores:
    """One item of a decoded `ScoreResponse`: only finite numbers in `scores`; each failed
    scorer in `errors` as `{"code", "message"}`."""

    id: str
    scores: dict[str, float]
    errors: dict[str, dict[str, str]] = field(default_factory=dict)
    details: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Scorer → what its score leaves unsaid for this item: a composite's `components` (each
    component's score), and `left_out` / `component_errors` when it renormalised without some;
    empty for a scorer that reports none."""

    def component(self, scorer: str, name: str) -> float | dict[str, str]:
        """Composite `scorer`'s component `name` for this item: its score (a finite number), or
        why there is none as `{"code", "message"}`: the composite failed the item (its error),
        left the component out (the component's error), or the answer carries no number for it
        (`invalid_response`). Never a number that the service did not send as one."""
        if scorer in self.errors:
            return self.errors[scorer]
        detail = self.details.get(scorer)
        detail = detail if isinstance(detail, dict) else {}
        values = detail.get(COMPONENTS)
        value = values.get(name) if isinstance(values, dict) else None
        if _score_problem(value) is None:
            return float(value)  # type: ignore[arg-type]
        errors = detail.get(COMPONENT_ERRORS)
        if isinstance(errors, dict) and name in errors:
            return _error(errors[name])
        if value is not None:
            return {
                "code": INVALID_RESPONSE_CODE,
                "message": f"component {name!r} of {scorer!r} is {value!r}",
            }
        return {"code": INVALID_RESPONSE_CODE, "message": f"no score for component {name!r} of {scorer!r}"}


RESPONSE_PROBLEMS = {
    "invalid_json": "the body is not JSON",
    "invalid_body": "the JSON does not have the documented shape",
    "missing_id": "a requested item id is absent from results",
    "extra_id": "results contain an id that was not requested",
    "duplicate_id": "an id appears more than once in results",
    "order_mismatch": "all ids present, but not in request order",
    "missing_scorer": "a requested scorer has neither a score nor an error for an item",
    "extra_scorer": "an item has a score from a scorer that was not requested",
    "score_none": "a score is null",
    "score_bool": "a score is true/false (JSON booleans are not rewards)",
    "score_non_numeric": "a score is a string, list or object",
    "score_non_finite": "a score is NaN or +-Infinity",
}
"""What `decode_score_response` finds wrong with a 200 body, by the name it reports."""


@dataclass(frozen=True)
class DecodedResponse:
    results: list[ItemScores]
    """Every well-formed result of a requested id, first occurrence, in the body's order."""
    problems: tuple[str, ...] = ()
    """Sorted `RESPONSE_PROBLEMS` names; empty: the body answers exactly what was asked."""


def _score_problem(value: Any) -> str | None:
    if value is None:
        return "score_none"
    if isinstance(value, bool):
        return "score_bool"
    if not isinstance(value, int | float):
        return "score_non_numeric"
    if not math.isfinite(value):
        return "score_non_finite"
    return None


def _error(value: Any) -> dict[str, str]:
    """An item error as `{"code", "message", "kind"}`; a server that predates `kind` (or sent one
    that is not a kind) gets the kind of its code from this side's table."""
    if isinstance(value, dict):
        code = str(value.get("code", HTTP_ERROR_CODE))
        kind = value.get("kind")
        kind = kind if kind in ("item", "service") else failure_kind(code)
        return {"code": code, "message": str(value.get("message", "")), "kind": kind}
    return {"code": str(value), "message": "", "kind": failure_kind(str(value))}


def decode_score_response(
    body: bytes | str, ids: Sequence[str] | None = None, scorers: Sequence[str] | None = None
) -> DecodedResponse:
    """A `POST /v1/score` 200 body → per-item scores, errors and details, and what is wrong with
    it (`RESPONSE_PROBLEMS`). Given the request's `ids` and `scorers`, every id must come back
    once, in order, each requested scorer with a score or an error, every score a finite number:
    a value that is not one is left out of `scores` and named, never passed on as a reward.
    The one decoder of the client and the load generator."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return DecodedResponse([], ("invalid_json",))
    raw_results = payload.get("results") if isinstance(payload, dict) else None
    if not isinstance(raw_results, list):
        return DecodedResponse([], ("invalid_body",))
    problems: set[str] = set()
    wanted = None if ids is None else set(ids)
    seen: dict[str, None] = {}  # ids in the order they came
    results: list[ItemScores] = []
    for raw in raw_results:
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
            problems.add("invalid_body")
            continue
        item_id, scores, errors = raw["id"], raw.get("scores") or {}, raw.get("errors") or {}
        details = raw.get("details") or {}
        if wanted is not None and item_id not in wanted:
            problems.add("extra_id")
            continue
        if item_id in seen:
            problems.add("duplicate_id")
            continue
        seen[item_id] = None
        if not all(isinstance(x, dict) for x in (scores, errors, details)):
            problems.add("invalid_body")
            continue
        if scorers is not None and set(scores) - set(scorers):
            problems.add("extra_scorer")
        valid: dict[str, float] = {}
        for name in scores if scorers is None else scorers:
            if name not in scores:
                if name not in errors:
                    problems.add("missing_scorer")
                continue
            problem = _score_problem(scores[name])
            if problem is None:
                valid[name] = float(scores[name])
            else:
                problems.add(problem)
        results.append(ItemScores(item_id, valid, {k: _error(v) for k, v in errors.items()}, details))
    if ids is not None:
        if wanted - seen.keys():
            problems.add("missing_id")
        elif not problems.intersection({"duplicate_id", "extra_id"}) and list(seen) != list(ids):
            problems.add("order_mismatch")
    return DecodedResponse(results, tuple(sorted(problems)))


# --- GET /v1/scorers


def _scorer_out() -> type[BaseModel]:
    """`ScorerInfo`'s fields as the response model; `extra` is absent when empty, and
    `modality` is any string on the wire (a plugin's own modality is reported, not a 500)."""
    hints = get_type_hints(ScorerInfo)
    spec: dict[str, Any] = {f.name: (hints[f.name], ...) for f in dataclasses.fields(ScorerInfo)}
    spec["modality"] = (str, ...)
    spec["extra"] = (
        dict[str, Any] | None,
        Field(default=None, description="kind-specific details; absent if none"),
    )
    spec["reads"] = (
        list[str] | None,
        Field(default=None, description="the item fields its score depends on; null: not declared"),
    )
    spec["options"] = (
        dict[str, Any],
        Field(default_factory=dict, description="every option of the scorer's kind with the value in effect"),
    )
    return create_model("ScorerOut", __module__=__name__, **spec)


ScorerOut = _scorer_out()
"""One entry of `GET /v1/scorers`: a `ScorerInfo` on the wire."""


def scorer_info_json(info: ScorerInfo) -> dict[str, Any]:
    """A `ScorerOut` body: the info's fields, `extra` only when it has any."""
    out = dataclasses.asdict(info)
    if not out["extra"]:
        del out["extra"]
    return out


class OptionOut(BaseModel):
    name: str
    type: str
    required: bool
    default: Any = Field(default=None, description="the value when the option is not set; absent if required")
    description: str = Field(description="what the option means")
    identity: bool = Field(description="whether the option is part of the scorer's identity")


class ScorersResponse(BaseModel):
    scorers: list[ScorerOut]  # type: ignore[valid-type]
    status: dict[str, Any] = Field(description="every configured scorer's load status")
    kinds: dict[str, list[OptionOut]] = Field(
        default_factory=dict, description="each hosted kind's options (name, type, default, meaning)"
    )


# --- health


class LiveOut(BaseModel):
    status: str = "ok"


class ReadyOut(BaseModel):
    ready: bool
    scorers: dict[str, Any]


class NotReadyOut(ErrorOut):
    scorers: dict[str, Any]


# --- /v1/lifecycle: offload, onload, drain, state (docs/lifecycle.md)


class LifecycleRequest(Strict):
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
