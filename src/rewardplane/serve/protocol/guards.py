"""What every JSON body goes through before a model sees it, whichever wire format it speaks.

NaN and ±Infinity (which Python's json accepts but JSON does not have), numbers that overflow
to infinity, integers over Python's 4,300-digit limit and nesting deeper than `MAX_JSON_DEPTH`
are refused with 422 `invalid_request`, never a 500, so free-form fields (`reference`,
`metadata`) can always be re-encoded for the deploy workers. Validation errors become one short
line naming where (`items.3.prompt: ...`), cut at `MAX_MESSAGE_CHARS`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from itertools import chain, compress, repeat
from operator import not_
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from rewardplane.serve.protocol.errors import ServeError

MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays/objects in a request body; deeper is 422 `invalid_request`."""
MAX_MESSAGE_CHARS = 300
"""Error messages are cut here, so a hostile field never comes back at full size."""
DEPTH_CHUNK = 1024
"""Containers `json_depth_exceeds` takes per step: between steps the GIL can pass."""


class Strict(BaseModel):
    """A request body: unknown keys refused, no type coercion."""

    model_config = ConfigDict(extra="forbid", strict=True)


class _NonFinite(ValueError):
    pass


def _no_constants(name: str) -> None:
    raise _NonFinite(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses to inf
        raise _NonFinite(f"{text[:40]} (not a finite number)")
    return value


def yielding_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An `object_pairs_hook` for bodies parsed in a thread. A Python hook (not the C default)
    on purpose: it runs bytecode once per JSON object, where the interpreter can hand the GIL to
    the event loop, so parsing a large body does not stall every other request for the whole
    parse (docs/reliability.md, fairness)."""
    return dict(pairs)


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


def load_json(
    raw: bytes | str, *, object_pairs_hook: Callable[[list], Any] | None = None, what: str = "body"
) -> Any:
    """JSON text → Python values, with the refusals above (422 `invalid_json` for text that is
    not JSON, `invalid_request` for what JSON cannot hold or nests too deep); `what` names the
    text in the messages."""
    try:
        data = json.loads(
            raw, parse_constant=_no_constants, parse_float=_finite_float, object_pairs_hook=object_pairs_hook
        )
    except _NonFinite as exc:
        raise ServeError("invalid_request", f"{exc} is not a JSON value"[:MAX_MESSAGE_CHARS]) from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ServeError("invalid_json", f"{what} is not valid JSON: {exc}"[:MAX_MESSAGE_CHARS]) from None
    except ValueError as exc:  # an integer over the interpreter's digit limit
        raise ServeError("invalid_request", f"a number in the {what} is too large: {exc}"[:120]) from None
    if json_depth_exceeds(data):
        raise ServeError(
            "invalid_request", f"the {what} nests arrays/objects deeper than {MAX_JSON_DEPTH} levels"
        )
    return data


def where(loc: list[Any], msg: str) -> str:
    """`a.b.3.c: msg`, long paths elided in the middle, cut at `MAX_MESSAGE_CHARS`."""
    parts = [str(p) for p in loc]
    path = ".".join(parts if len(parts) <= 8 else [*parts[:4], "…", *parts[-3:]]) or "body"
    return f"{path[:120]}: {msg}"[:MAX_MESSAGE_CHARS]


def first_error(exc: ValidationError, prefix: tuple[Any, ...] = (), offset: int = 0) -> str:
    """The first validation error as one line; `offset` shifts a leading list index (items
    validated in chunks report their index in the whole list)."""
    e = exc.errors(include_url=False, include_input=False)[0]
    loc = list(e.get("loc", ()))
    if offset and loc and isinstance(loc[0], int):
        loc[0] += offset
    return where([*prefix, *loc], e.get("msg", "invalid"))


def validate(model: type[BaseModel], data: Any) -> Any:
    """`model.model_validate(data)`, a failure as 422 `invalid_request` naming where."""
    try:
        return model.model_validate(data)
    except (ValidationError, RecursionError) as exc:
        message = first_error(exc) if isinstance(exc, ValidationError) else "the body nests too deeply"
        raise ServeError("invalid_request", message) from None


def parse_trainer_body(raw: bytes | str, model: type[BaseModel]) -> Any:
    """A trainer protocol's JSON body → `model`, with the same refusals as `parse_score_request`
    (NaN/Infinity, overflowing numbers, over-long integers, deep nesting: 422, never a 500)."""
    return validate(model, load_json(raw))
