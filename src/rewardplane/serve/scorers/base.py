"""The scorer contract shared by the in-process service, scorer workers and Ray Serve.

A scorer turns a batch of items into one float per item. It may return NaN/inf or raise;
it never decides what a failure means. The batching layer above it converts non-finite
values into per-item `non_finite` errors and exceptions into `scorer_failed`, so a failure
can never become a reward.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

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


class Scorer(abc.ABC):
    """Base class for every scorer kind (`rm`, `hf_seqcls`, `clip`, `pickscore`, rules, ...).

    Subclasses set `kind` and `modality`, load weights in `load()`, and implement
    `score_batch`. `identity()` must be stable for the same weights, config and dtype.
    """

    kind: ClassVar[str]
    modality: ClassVar[Modality]

    def __init__(self, name: str, *, max_batch_size: int = 32, max_wait_ms: float = 5.0) -> None:
        self.name = name
        self.max_batch_size = max_batch_size
        self.max_wait_ms = max_wait_ms

    @abc.abstractmethod
    def load(self) -> None:
        """Load weights and move them to the device. Called once before warm-up."""

    @abc.abstractmethod
    def score_batch(self, items: list[ScoreItem]) -> list[float | ItemError]:
        """Return one float (or `ItemError`) per item, in order. NaN/inf are allowed here; raising
        fails the batch."""

    @abc.abstractmethod
    def info(self) -> ScorerInfo:
        """Describe the loaded scorer, including its stable identity hash."""

    @classmethod
    def from_spec(cls, spec: Any) -> Scorer:
        """Build from a `rewardplane.serve.config.ScorerSpec`. Kinds with options override this."""
        return cls(spec.name, max_batch_size=spec.max_batch_size, max_wait_ms=spec.max_wait_ms)

    def item_tokens(self, item: ScoreItem) -> int | None:
        """Approximate token count, for the batcher's token budget. None: the scorer has no budget."""
        return None

    packs_tokens: ClassVar[bool] = False
    """How a batch's token budget is spent: True, the sum of its items' tokens (a padding-free
    scorer); False, rows x the longest row (a padded forward)."""

    queues_on_device: ClassVar[bool] = False
    """True: the batches in flight at once (`concurrent_batches` > 1) run one after another on one
    device (a CUDA stream), so the batcher fills the next batch while the device is busy and
    launches it just before the device frees, rather than as soon as a slot is free."""

    concurrent_batches: ClassVar[int] = 1
    """How many batches the batcher may hand `score_prepared` at once, each from its own thread.
    1 for a model (not assumed thread-safe; one forward at a time saturates its device); more for
    a scorer whose batch fans out to a shared, thread-safe pool of its own (the `math` scorer's
    processes), where one batch at a time would leave the pool idle behind each batch's slowest
    item."""

    def prepare(self, item: ScoreItem) -> Any:
        """Admission-time work on one item (tokenisation, decoding), run by the batcher off the
        event loop and off the scoring thread, so a queued item is ready to batch. Return what
        `score_prepared` takes, or an `ItemError`: that item then fails alone, before it reaches
        a batch. The default keeps the item as it is."""
        return item

    def prepare_many(self, items: list[ScoreItem]) -> list[Any]:
        """`prepare` for several items admitted together (one request's, or a chunk of it), so
        a scorer can share work across them: one tokenizer call, a GRPO group's prompt rendered
        once. If it raises, the batcher prepares the items one by one, so only a bad item fails.
        The default is `prepare` per item."""
        return [self.prepare(item) for item in items]

    def prepared_tokens(self, prepared: Any) -> int | None:
        """Exact token count of a prepared item, for the token budget (None: fall back to
        `item_tokens`)."""
        return None

    def score_prepared(self, batch: list[Any]) -> list[float | ItemError]:
        """Score what `prepare` returned, one result per entry in order (default: `score_batch`)."""
        return self.score_batch(batch)

    def take_batch_stats(self) -> dict[str, int]:
        """Token accounting of the last batch (real, computed, padding, shared) and any scorer
        events (other keys: `rewardplane_scorer_events_total`), for /metrics."""
        return {}

    def hosted_references(self) -> tuple[str, ...]:
        """Other scorers of the same server this one scores through (a composite's `scorer:`
        components), so a model hosted once serves both. The backend loads them first, hands
        over one handle each with `bind_hosted`, and admits a request to this scorer through
        their lifecycles too (503 `offloaded`, or their auto onload, as a direct request)."""
        return ()

    def bind_hosted(self, hosted: dict[str, Any]) -> None:
        """Before `load()`: name → a handle on that hosted scorer whose `score_batch(items)`
        goes through its own queue and batches, with `warmup_item()` and `info()`."""
        raise NotImplementedError(f"{type(self).__name__} references no hosted scorers")

    def warmup_item(self) -> ScoreItem:
        """An input that a healthy scorer must score to a finite value before readiness."""
        return ScoreItem(id="warmup", prompt="Say hello.", response="Hello!", image=None)
