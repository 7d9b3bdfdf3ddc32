"""What the wire says about one item and one scorer: `ScoreItem`, `ItemError`, `DetailedScore`,
`ScorerInfo`.

These are the protocol's own types: the HTTP app, the client, the deploy transport, the load
generator and every scorer speak them. They live here, not beside the `Scorer` base class, so
that a speaker of the protocol (the client, the bench) never imports a scorer module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rewardplane.data.records import Message

Modality = Literal["text", "image_text", "rule"]


@dataclass(frozen=True)
class ScoreItem:
    """One item to score. `image` is raw encoded bytes (JPEG/PNG/...), decoded by the scorer.

    The fields mirror the wire item (`rewardplane.serve.protocol.ItemIn`) one to one."""

    id: str
    prompt: str | list[Message]
    response: str | list[Message]
    image: bytes | None = None
    reference: str | dict[str, Any] | list[Any] | int | float | bool | None = None
    """A reference answer (a string or any JSON value) for rule and verifier scorers such as
    `exact_match`; ignored by model scorers."""
    group_id: str | None = None
    """Items that belong together (e.g. the GRPO samples of one prompt); scorers may compare them."""
    metadata: dict[str, Any] | None = None
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


class DetailedScore(float):
    """A score (a float, usable as one everywhere) with per-item detail that travels to the
    client next to it: `results[i].details[scorer]` on the wire (docs/serve.md). A scorer returns
    one where a bare number would hide something the caller should see, such as the components a
    composite left out of this item's reward. `detail` is a JSON object; empty means none."""

    detail: dict[str, Any]

    def __new__(cls, value: float, detail: dict[str, Any] | None = None) -> DetailedScore:
        obj = super().__new__(cls, value)
        obj.detail = dict(detail or {})
        return obj


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
