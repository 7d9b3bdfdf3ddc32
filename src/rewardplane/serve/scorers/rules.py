"""Rule scorers: deterministic functions of the response text, no model.

- `exact_match`: 1.0 when the response equals the item's `reference` after normalisation
  (`options.normalize`: strip + casefold + collapse whitespace by default), else 0.0. An item
  without a reference is a `missing_reference` error, not a 0.
- `regex`: 1.0 when `options.pattern` matches (`options.mode`: `search` (default) or `fullmatch`).
  The pattern is compiled by RE2 (`serve/linear.py`): matching is linear in the response and
  releases the GIL; a pattern RE2 cannot run (backreferences, lookaround) refuses the config.
- `length`: the response length in `options.unit` (`chars` default, or `words`).

Every rule is linear in the response, and each item is scored apart under `deadline_s`
(`Scorer.item_deadline_s`): past it the item is a `timeout` error and its batch-mates do not wait.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from rewardplane.core.config import FieldError
from rewardplane.serve.admission import REFERENCE, RESPONSE
from rewardplane.serve.linear import UnsupportedPattern, compile_linear, overescaped
from rewardplane.serve.protocol import ItemError, ScoreItem
from rewardplane.serve.scorers.base import Scorer
from rewardplane.serve.scorers.common import as_text
from rewardplane.serve.scorers.options import ScorerOptions

log = logging.getLogger(__name__)


class RuleOptions(ScorerOptions):
    deadline_s: float = Field(1.0, gt=0)
    """Wall-clock limit on scoring one item; past it the item is a `timeout` error (its
    batch-mates do not wait)."""

    not_in_identity: ClassVar[frozenset[str]] = frozenset({"deadline_s"})


class _RuleScorer(Scorer):
    modality: ClassVar = "rule"
    lowest_score: ClassVar[float | None] = 0.0
    reads: ClassVar[frozenset[str]] = frozenset({RESPONSE})
    """The response only; an empty one is scored by the rule ("" has length 0, a pattern may
    match it, a reference may be empty)."""
    Options = RuleOptions

    def load(self) -> None:
        """Nothing to load."""

    @property
    def item_deadline_s(self) -> float:
        return self.options.deadline_s


class ExactMatchOptions(RuleOptions):
    normalize: bool = True
    """Strip, collapse whitespace and casefold both the response and the reference before comparing."""


class ExactMatchScorer(_RuleScorer):
    kind: ClassVar[str] = "exact_match"
    Options = ExactMatchOptions
    reads: ClassVar[frozenset[str]] = frozenset({RESPONSE, REFERENCE})

    def _norm(self, text: str) -> str:
        return " ".join(text.split()).casefold() if self.options.normalize else text

    def score_batch(self, items: list[ScoreItem]) -> list[float | ItemError]:
        out: list[float | ItemError] = []
        for item in items:
            if item.reference is None:
                out.append(ItemError("missing_reference", "exact_match needs the item's 'reference'"))
            elif not isinstance(item.reference, str):
                out.append(ItemError("bad_input", "exact_match needs a string 'reference'"))
            else:
                out.append(float(self._norm(as_text(item.response)) == self._norm(item.reference)))
        return out

    def warmup_item(self) -> ScoreItem:
        return ScoreItem(id="warmup", prompt="", response="ok", reference="ok")


class RegexOptions(RuleOptions):
    pattern: str
    """The regular expression (Python `re` syntax, run by RE2 in linear time: no backreferences
    or lookaround) the response must match for 1.0."""
    mode: Literal["search", "fullmatch"] = "search"
    """`search`: a match anywhere in the response; `fullmatch`: the whole response."""
    flags: list[Literal["IGNORECASE", "MULTILINE", "DOTALL"]] = Field(default_factory=list)
    """`re` flags applied to `pattern`."""
    examples: list[str] = Field(default_factory=list)
    """Responses the pattern is meant to match: at start-up a pattern that matches none of them is
    reported in a warning line."""

    not_in_identity: ClassVar[frozenset[str]] = frozenset({"deadline_s", "examples"})

    @model_validator(mode="after")
    def _compiles(self) -> RegexOptions:
        try:
            self.compiled()
        except re.error as exc:
            raise FieldError("pattern", f"does not compile: {exc}") from None
        except UnsupportedPattern:
            pass  # refused by `RegexScorer.check_spec`, where the line can name the scorer
        return self

    def compiled(self) -> Any:
        """The pattern compiled by RE2 (`serve/linear.py`)."""
        return compile_linear(self.pattern, self.flags)


class RegexScorer(_RuleScorer):
    kind: ClassVar[str] = "regex"
    Options = RegexOptions

    @classmethod
    def check_spec(cls, spec: Any) -> None:
        """A pattern RE2 cannot run refuses the config, in one line naming the scorer and the
        construct (`serve/linear.py`)."""
        try:
            spec.options.compiled()
        except UnsupportedPattern as exc:
            raise FieldError(
                "options.pattern", f"scorer {spec.name!r}: {spec.options.pattern!r} {exc}"
            ) from None

    @functools.cached_property
    def _match(self) -> Any:
        regex = self.options.compiled()
        return regex.fullmatch if self.options.mode == "fullmatch" else regex.search

    def load(self) -> None:
        """Nothing to load; a pattern that looks pasted with one backslash level too many, or
        that matches none of its `examples`, is reported in one warning line."""
        if warning := self.pattern_warning():
            log.warning("%s", warning)

    def pattern_warning(self) -> str | None:
        """The start-up warning for this scorer's pattern, or None."""
        o = self.options
        shown = f"scorer {self.name!r} (regex): pattern {o.pattern!r} (as compiled)"
        if spot := overescaped(o.pattern):
            return (
                f"{shown} has a doubled backslash before a character that needs none at {spot!r}: "
                "it matches a literal backslash; was the pattern pasted with one backslash level too many?"
            )
        if o.examples and not any(self._match(e) is not None for e in o.examples):
            return f"{shown} matches none of its {len(o.examples)} examples"
        return None

    def score_batch(self, items: list[ScoreItem]) -> list[float | ItemError]:
        return [float(self._match(as_text(item.response)) is not None) for item in items]

    def warmup_item(self) -> ScoreItem:
        examples = self.options.examples
        return ScoreItem(id="warmup", prompt="", response=examples[0]) if examples else super().warmup_item()


class LengthOptions(RuleOptions):
    unit: Literal["chars", "words"] = "chars"
    """What is counted: characters, or whitespace-separated words."""


class LengthScorer(_RuleScorer):
    kind: ClassVar[str] = "length"
    Options = LengthOptions

    def score_batch(self, items: list[ScoreItem]) -> list[float | ItemError]:
        words = self.options.unit == "words"
        return [float(len(as_text(i.response).split()) if words else len(as_text(i.response))) for i in items]
