"""Rule scorers: deterministic functions of the response text, no model.

- `exact_match`: 1.0 when the response equals the item's `reference` after normalisation
  (`options.normalize`: strip + casefold + collapse whitespace by default), else 0.0. An item
  without a reference is a `missing_reference` error, not a 0.
- `regex`: 1.0 when `options.pattern` matches (`options.mode`: `search` (default) or `fullmatch`).
- `length`: the response length in `options.unit` (`chars` default, or `words`).
"""

from __future__ import annotations

import functools
import re
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from rewardplane.core.config import FieldError
from rewardplane.serve.admission import REFERENCE, RESPONSE
from rewardplane.serve.protocol import ItemError, ScoreItem
from rewardplane.serve.scorers.base import Scorer
from rewardplane.serve.scorers.common import as_text
from rewardplane.serve.scorers.options import ScorerOptions


class _RuleScorer(Scorer):
    modality: ClassVar = "rule"
    lowest_score: ClassVar[float | None] = 0.0
    reads: ClassVar[frozenset[str]] = frozenset({RESPONSE})
    """The response only; an empty one is scored by the rule ("" has length 0, a pattern may
    match it, a reference may be empty)."""

    def load(self) -> None:
        """Nothing to load."""


class ExactMatchOptions(ScorerOptions):
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


class RegexOptions(ScorerOptions):
    pattern: str
    """The regular expression (Python `re` syntax) the response must match for 1.0."""
    mode: Literal["search", "fullmatch"] = "search"
    """`search`: a match anywhere in the response; `fullmatch`: the whole response."""
    flags: list[Literal["IGNORECASE", "MULTILINE", "DOTALL"]] = Field(default_factory=list)
    """`re` flags applied to `pattern`."""

    @model_validator(mode="after")
    def _compiles(self) -> RegexOptions:
        try:
            self.compiled()
        except re.error as exc:
            raise FieldError("pattern", f"does not compile: {exc}") from None
        return self

    def compiled(self) -> re.Pattern[str]:
        flags = 0
        for flag in self.flags:
            flags |= getattr(re, flag)
        return re.compile(self.pattern, flags)


class RegexScorer(_RuleScorer):
    kind: ClassVar[str] = "regex"
    Options = RegexOptions

    @functools.cached_property
    def _match(self) -> Any:
        regex = self.options.compiled()
        return regex.fullmatch if self.options.mode == "fullmatch" else regex.search

    def score_batch(self, items: list[ScoreItem]) -> list[float | ItemError]:
        return [float(self._match(as_text(item.response)) is not None) for item in items]


class LengthOptions(ScorerOptions):
    unit: Literal["chars", "words"] = "chars"
    """What is counted: characters, or whitespace-separated words."""


class LengthScorer(_RuleScorer):
    kind: ClassVar[str] = "length"
    Options = LengthOptions

    def score_batch(self, items: list[ScoreItem]) -> list[float | ItemError]:
        words = self.options.unit == "words"
        return [float(len(as_text(i.response).split()) if words else len(as_text(i.response))) for i in items]
