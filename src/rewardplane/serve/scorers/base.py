"""The scorer contract shared by the in-process service, scorer workers and Ray Serve.

A scorer turns a batch of items into one float per item. It may return NaN/inf or raise;
it never decides what a failure means. The batching layer above it converts non-finite
values into per-item `non_finite` errors and exceptions into `scorer_failed`, so a failure
can never become a reward. The item, error and info types are the protocol's
(`rewardplane.serve.protocol.items`): a scorer speaks the wire's vocabulary, never the reverse.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

from rewardplane import __version__
from rewardplane.core.config import FieldError, parse
from rewardplane.core.errors import ConfigError
from rewardplane.core.hashing import sha256_json
from rewardplane.serve.admission import PROMPT, REFERENCE, RESPONSE
from rewardplane.serve.protocol.items import ItemError, Modality, ScoreItem, ScorerInfo
from rewardplane.serve.scorers.options import ScorerOptions

VERSION = __version__


def identity(*, kind: str, weights: str, config: dict[str, Any], dtype: str, options: dict[str, Any]) -> str:
    """Stable id a client can pin: same weights + model config + dtype + scoring options -> same hash."""
    return sha256_json(
        {"kind": kind, "weights": weights, "config": config, "dtype": dtype, "options": options}
    )


class Scorer(abc.ABC):
    """Base class for every scorer kind (`rm`, `hf_seqcls`, `clip`, `pickscore`, rules, ...).

    Subclasses set `kind`, `modality` and `Options` (the kind's options model), load weights in
    `load()` and implement `score_batch`. `info()` is built here from the options and a few
    kind-specific hooks (`placement`, `identity_config`, `identity_options`, `info_extra`), so
    the identity is computed one way for every kind: stable for the same weights, model config,
    dtype and score-changing options.
    """

    kind: ClassVar[str]
    modality: ClassVar[Modality]
    Options: ClassVar[type[ScorerOptions]] = ScorerOptions
    """The kind's options model; the base takes none (docs/serve.md, third-party scorers)."""

    def __init__(
        self,
        name: str,
        options: ScorerOptions | dict[str, Any] | None = None,
        *,
        max_batch_size: int = 32,
        max_wait_ms: float = 5.0,
        path: str | None = None,
        shape: str | None = None,
        dtype: str = "fp32",
        device: str = "cpu",
    ) -> None:
        self.name = name
        self.options = self._typed_options(options)
        self.max_batch_size, self.max_wait_ms = max_batch_size, max_wait_ms
        self.path, self.shape, self.dtype, self.device = path, shape, dtype, device
        self._weights = ""  # what identifies the weights (a digest), set by `load()` where there are any
        try:
            self.check_spec(self)  # the spec's rules hold for a scorer built directly too
        except FieldError as exc:
            raise ConfigError(f"scorer {name!r} ({self.kind}): {exc.line()}") from None

    def _typed_options(self, options: ScorerOptions | dict[str, Any] | None) -> Any:
        """The spec's options as they come (already this kind's model), or a mapping validated by
        the one loader (direct construction): one-line errors naming `options.<key>`."""
        if isinstance(options, self.Options):
            return options
        try:
            return parse(self.Options, options, where="options")
        except ConfigError as exc:
            raise ConfigError(f"scorer {self.name!r} ({self.kind}): {exc.message}") from None

    @classmethod
    def from_spec(cls, spec: Any) -> Scorer:
        """Build from a `rewardplane.serve.scorers.registry.ScorerSpec` (options already typed)."""
        return cls(
            spec.name,
            spec.options,
            max_batch_size=spec.max_batch_size,
            max_wait_ms=spec.max_wait_ms,
            path=spec.path,
            shape=spec.shape,
            dtype=spec.dtype,
            device=spec.device,
        )

    @classmethod
    def check_spec(cls, spec: Any) -> None:
        """Rules between the kind and the spec's own keys (`name`, `path`, `shape`, `options`),
        checked when the spec is read and when a scorer is built directly (`spec` is then the
        scorer): raise `rewardplane.core.config.FieldError(key, ...)` naming the spec key."""
        return None  # no rules by default

    @abc.abstractmethod
    def load(self) -> None:
        """Load weights and move them to the device. Called once before warm-up."""

    @abc.abstractmethod
    def score_batch(self, items: list[ScoreItem]) -> list[float | ItemError]:
        """Return one float (or `ItemError`) per item, in order. NaN/inf are allowed here; raising
        fails the batch."""

    def info(self) -> ScorerInfo:
        """Describe the loaded scorer, including its stable identity hash."""
        dtype, device = self.placement()
        return ScorerInfo(
            name=self.name,
            kind=self.kind,
            modality=self.modality,
            dtype=dtype,
            device=device,
            version=VERSION,
            identity=identity(
                kind=self.kind,
                weights=self._weights,
                config=self.identity_config(),
                dtype=dtype,
                options=self.identity_options(),
            ),
            max_batch_size=self.max_batch_size,
            max_wait_ms=self.max_wait_ms,
            extra=self.info_extra(),
            options=self.options.in_effect(),
            reads=tuple(sorted(self.item_fields())),
        )

    def placement(self) -> tuple[str, str]:
        """(dtype, device) as `info()` reports them: no weights, no dtype, by default."""
        return "none", "cpu"

    def identity_config(self) -> dict[str, Any]:
        """What else identifies the scorer's behaviour (a model's config, a library version)."""
        return {}

    def identity_options(self) -> dict[str, Any]:
        """The options in the identity: those that can change a score."""
        return self.options.for_identity()

    def info_extra(self) -> dict[str, Any]:
        """Kind-specific details for `GET /v1/scorers` (resolved limits, counters, ...)."""
        return {}

    def item_tokens(self, item: ScoreItem) -> int | None:
        """Approximate token count, for the batcher's token budget. None: the scorer has no budget."""
        return None

    lowest_score: ClassVar[float | None] = None
    """The lowest score this kind gives (a verifier's 0.0), or None where it has none (a reward
    model): what a composite counts for an item that failed this component by its own doing."""
    reads: ClassVar[frozenset[str]] = frozenset({PROMPT, RESPONSE, REFERENCE})
    """The item fields the kind's score depends on (`prompt`, `response`, `reference`,
    `image`): the admission contract (`serve/admission.py`) refuses an item whose field it reads
    is missing (the response) or cannot be encoded, before `prepare`. The default is every text
    field; a kind that reads fewer says so (an image scorer never reads the response)."""

    def item_fields(self) -> frozenset[str]:
        """What `info()` publishes as `reads`: the fields the score depends on (`reads`; a kind
        that admits nothing itself and scores through others says theirs)."""
        return self.reads

    @property
    def empty_response(self) -> str | float:
        """What admission does with an empty or whitespace-only response: `error` (`bad_input`),
        `score` (scored as given) or a number (that fixed reward). A kind with an
        `empty_response` option applies it; otherwise a scorer of text (`modality: text`, a
        model reading the response) refuses it and a rule or verifier (`modality: rule`) scores
        it by its rule, as contract line 1 says (docs/serve.md "Admission")."""
        option = getattr(self.options, "empty_response", None)
        if option is not None:
            return option
        return "error" if self.modality == "text" else "score"

    groups_in_one_batch: ClassVar[bool] = False
    """True: items that share a `group_id` must be scored in one batch (a composite that
    normalises per group), so the batcher never splits a request's run of a group across two
    batches."""

    packs_tokens: ClassVar[bool] = False
    """How a batch's token budget is spent: True, the sum of its items' tokens (a padding-free
    scorer); False, rows x the longest row (a padded forward)."""

    queues_on_device: ClassVar[bool] = False
    """True: the batches in flight at once (`concurrent_batches` > 1) run one after another on one
    device (a CUDA stream), so the batcher fills the next batch while the device is busy and
    launches it just before the device frees, rather than as soon as a slot is free."""

    item_deadline_s: float | None = None
    """Seconds scoring one item may take, for a scorer whose work is over the item's text on
    this host (the rules). When set, the batcher scores such a batch's items apart, each in its
    own call on the scorer's text threads, and an item still running at its deadline is a
    `timeout` error while its batch-mates' results go back at once. Only for work that is linear
    in its input and releases the GIL (RE2, short C calls), so an item past its deadline ends
    soon after on its own and the event loop never waits on it. None: no per-item deadline (a
    model's forward, a verifier that enforces its own: the code sandbox, the math pool, the
    judge's request timeout)."""

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
