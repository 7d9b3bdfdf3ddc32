"""Rule scorers: deterministic functions of the response text, no model.

- `exact_match`: 1.0 when the response equals the item's `reference` after normalisation
  (`options.normalize`: strip + casefold + collapse whitespace by default), else 0.0. An item
  without a reference is a `missing_reference` error, not a 0.
- `regex`: 1.0 when `options.pattern` matches (`options.mode`: `search` (default) or `fullmatch`).
- `length`: the response length in `options.unit` (`chars` default, or `words`).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from rewardplane.core.errors import ConfigError
from rewardplane.serve.protocol import ItemError, ScoreItem, ScorerInfo
from rewardplane.serve.scorers.common import VERSION, OptionsScorer, as_text, identity


class _RuleScorer(OptionsScorer):
    modality: ClassVar = "rule"
    allowed_options: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self,
        name: str,
        *,
        options: dict[str, Any] | None = None,
        max_batch_size: int = 256,
        max_wait_ms: float = 0.0,
    ) -> None:
        super().__init__(name, options=options, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms)

    def load(self) -> None:
        """Nothing to load."""

    def info(self) -> ScorerInfo:
        return ScorerInfo(
            name=self.name,
            kind=self.kind,
            modality=self.modality,
            dtype="none",
            device="cpu",
            version=VERSION,
            identity=identity(kind=self.kind, weights="", config={}, dtype="none", options=self.options),
            max_batch_size=self.max_batch_size,
            max_wait_ms=self.max_wait_ms,
        )


class ExactMatchScorer(_RuleScorer):
    kind: ClassVar[str] = "exact_match"
    allowed_options = frozenset({"normalize"})

    def _norm(self, text: str) -> str:
        return " ".join(text.split()).casefold() if self.options.get("normalize", True) else text

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


class RegexScorer(_RuleScorer):
    kind: ClassVar[str] = "regex"
    allowed_options = frozenset({"pattern", "mode", "flags"})

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        pattern = self.options.get("pattern")
        if not isinstance(pattern, str):
            raise ConfigError(f"scorer {name!r} (regex): options.pattern (a string) is required")
        mode = self.options.get("mode", "search")
        if mode not in ("search", "fullmatch"):
            raise ConfigError(f"scorer {name!r} (regex): options.mode must be search or fullmatch")
        flags = 0
        for flag in self.options.get("flags", []):
            if flag not in ("IGNORECASE", "MULTILINE", "DOTALL"):
                raise ConfigError(f"scorer {name!r} (regex): unsupported flag {flag!r}")
            flags |= getattr(re, flag)
        try:
            self._regex = re.compile(pattern, flags)
        except re.error as exc:
            raise ConfigError(f"scorer {name!r} (regex): bad pattern: {exc}") from None
        self._match = self._regex.fullmatch if mode == "fullmatch" else self._regex.search

    def score_batch(self, items: list[ScoreItem]) -> list[float | ItemError]:
        return [float(self._match(as_text(item.response)) is not None) for item in items]


class LengthScorer(_RuleScorer):
    kind: ClassVar[str] = "length"
    allowed_options = frozenset({"unit"})

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        if self.options.get("unit", "chars") not in ("chars", "words"):
            raise ConfigError(f"scorer {name!r} (length): options.unit must be chars or words")

    def score_batch(self, items: list[ScoreItem]) -> list[float | ItemError]:
        words = self.options.get("unit", "chars") == "words"
        return [float(len(as_text(i.response).split()) if words else len(as_text(i.response))) for i in items]
