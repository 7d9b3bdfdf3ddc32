"""What the wire says about one item and one scorer: `ScoreItem`, `ItemError`, `DetailedScore`,
`ScorerInfo`.

These are the protocol's own types: the HTTP app, the client, the deploy transport, the load
generator and every scorer speak them. They live here, not beside the `Scorer` base class, so
that a speaker of the protocol (the client, the bench) never imports a scorer module.

`ScoreItem` is the one definition of an item. Each field says how it looks on the wire in its
`wire(...)` metadata (a type when the JSON form differs, pydantic `Field` settings), and
everything else is derived from the dataclass: the request model `ItemIn`, the JSON codec, the
deploy transport's frames, the items file reader (`codec.py`). A new item field is one line
here (and its row in docs/serve.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, JsonValue

from rewardplane.data.records import Message
from rewardplane.serve.protocol.guards import Strict

Modality = Literal["text", "image_text", "rule"]

WIRE = "wire"
"""The dataclass field metadata key that holds a field's wire form (see `wire`)."""


def wire(type_: Any = None, **settings: Any) -> dict[str, Any]:
    """Field metadata: the field's JSON type when it differs from its Python one, and the
    pydantic `Field` settings (`default`, limits, `description`) of its wire form."""
    return {WIRE: (type_, settings)}


class MessageIn(Strict):
    role: str
    content: str


class ImageIn(Strict):
    b64: str | None = Field(default=None, description="base64 of the encoded image bytes (JPEG/PNG/WebP)")
    part: str | None = Field(default=None, description="name of a multipart file part holding the bytes")


@dataclass(frozen=True)
class ScoreItem:
    """One item to score. `image` is raw encoded bytes (JPEG/PNG/...), decoded by the scorer."""

    id: str = field(metadata=wire(min_length=1, max_length=512))
    prompt: str | list[Message] = field(metadata=wire(str | list[MessageIn], default=""))
    response: str | list[Message] | None = field(
        metadata=wire(
            str | list[MessageIn] | None,
            default=None,
            description="the text or assistant turn(s) scored; absent or null: a missing response",
        )
    )
    """None when the request has none: a scorer that reads responses refuses the item at
    admission (`bad_input`, `serve/admission.py`), and `""` is an empty response, which each
    kind's `empty_response` policy decides."""
    image: bytes | None = field(default=None, metadata=wire(ImageIn | None))
    reference: str | dict[str, Any] | list[Any] | int | float | bool | None = field(
        default=None,
        metadata=wire(
            JsonValue, description="reference answer for verifier/rule scorers: a string or any JSON value"
        ),
    )
    """A reference answer (a string or any JSON value) for rule and verifier scorers such as
    `exact_match`; ignored by model scorers."""
    group_id: str | None = field(
        default=None,
        metadata=wire(max_length=512, description="items of one group (e.g. GRPO samples of a prompt)"),
    )
    """Items that belong together (e.g. the GRPO samples of one prompt); scorers may compare them."""
    metadata: dict[str, Any] | None = field(
        default=None,
        metadata=wire(
            dict[str, JsonValue] | None, description="free-form JSON object passed to scorers unchanged"
        ),
    )
    """A free-form JSON object from the request, passed through unchanged."""


RAW_TEXT = "rewardplane.raw_text"
"""An item `metadata` key set (to True) by routes whose callers send the whole decoded sequence
as the response (OpenRLHF's `query`): text scorers then tokenise it as given, with no chat
template and no added special tokens, and read the reward at its last token, as OpenRLHF's own
reward-model server does. It is never read from the wire."""


@dataclass(frozen=True)
class ItemError:
    """A per-item failure. Scorers may return one in place of a float (e.g. an undecodable image),
    and the batcher produces them for NaN/inf (`non_finite`) and exceptions (`scorer_failed`)."""

    code: str
    message: str


COMPONENTS = "components"
"""`details[<composite>][COMPONENTS]`: each component's score for the item (finite numbers only)."""
LEFT_OUT = "left_out"
"""`details[<composite>][LEFT_OUT]`: the components left out of the item's reward (`on_failure:
renormalize`); each has no number, and its error is under `COMPONENT_ERRORS`."""
FLOORED = "floored"
"""`details[<composite>][FLOORED]`: the components that failed by the item's own doing (an
`item`-kind error) under `on_failure: renormalize` and count as their lowest score, which
`COMPONENTS` holds; their errors are under `COMPONENT_ERRORS`."""
COMPONENT_ERRORS = "component_errors"
"""`details[<composite>][COMPONENT_ERRORS]`: a left-out or floored component → its
`{"code", "message", "kind"}`."""


class DetailedScore(float):
    """A score (a float, usable as one everywhere) with per-item detail that travels to the
    client next to it: `results[i].details[scorer]` on the wire (docs/serve.md). A scorer returns
    one where a bare number would hide something the caller should see, such as a composite's
    components and those it left out of this item's reward. `detail` is a JSON object; empty
    means none."""

    detail: dict[str, Any]

    def __new__(cls, value: float, detail: dict[str, Any] | None = None) -> DetailedScore:
        obj = super().__new__(cls, value)
        obj.detail = dict(detail or {})
        return obj

    @staticmethod
    def components_of(value: object) -> dict[str, float]:
        """A result's component scores (a composite's `details.components`); {} for any other."""
        if not isinstance(value, DetailedScore):
            return {}
        components = value.detail.get(COMPONENTS)
        return dict(components) if isinstance(components, dict) else {}


@dataclass(frozen=True)
class ScorerInfo:
    """What `GET /v1/scorers` reports and what clients pin (`identity`)."""

    name: str
    kind: str
    modality: Modality
    dtype: str
    device: str
    version: str
    identity: str
    max_batch_size: int
    max_wait_ms: float
    extra: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    """Every option of the scorer's kind with the value in effect (defaults filled in)."""
    reads: tuple[str, ...] | None = None
    """The item fields its score depends on (`prompt`, `response`, `reference`, `image`; a
    composite: its components'), so a client knows what to send (verl's adapter: whether the
    prompt is needed). None: not declared (a scorer built outside `Scorer.info`)."""
