"""The one data pipeline: read → normalise → validate → tokenise → count rejections per reason.

Every consumer of preference data runs it: `rewardplane data validate|prepare|freeze-probe`,
training's data preparation (`rewardplane.train.data`), probe freezing (`rewardplane.data.probe`)
and `rewardplane eval`. So a row is accepted or rejected — with the same reason code — by the
same code wherever it is read, and every count comes from one `Summary`.

A source is a file (JSONL, JSON array, Parquet; `rewardplane.data.reader`) or an iterable of
already decoded rows (the built-in synthetic task).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewardplane.data.overlap import ContentHashes
from rewardplane.data.reader import iter_pairs, normalize_rows
from rewardplane.data.reasons import Rejection, empty_counts
from rewardplane.data.records import PreferencePair, TokenizedPair
from rewardplane.data.tokenize import TokenizeSettings, tokenize_pair

Checked = tuple[PreferencePair, TokenizedPair | None]
Source = str | Path | Iterable[Any]


@dataclass
class Summary:
    """Rows seen, rows accepted, and rejections per reason (every reason present, zeros included)."""

    rows: int = 0
    valid: int = 0
    rejections: dict[str, int] = field(default_factory=empty_counts)

    @property
    def rejected(self) -> int:
        return self.rows - self.valid

    def add(self, item: Checked | Rejection) -> None:
        self.rows += 1
        if isinstance(item, Rejection):
            self.rejections[item.reason] += 1
        else:
            self.valid += 1

    def nonzero(self) -> dict[str, int]:
        """The reasons that occurred, by name: what training and evaluation log."""
        return {reason: count for reason, count in sorted(self.rejections.items()) if count}

    def to_json(self) -> dict:
        return {
            "rows": self.rows,
            "valid": self.valid,
            "rejected": self.rejected,
            "rejections": dict(self.rejections),
        }

    def table(self) -> str:
        """The summary table `rewardplane data validate` prints (every reason, zeros included)."""
        width = max(len(reason) for reason in self.rejections) + 2
        lines = [f"{'rows':<{width + 2}}{self.rows:>10}", f"{'valid':<{width + 2}}{self.valid:>10}"]
        lines.append(f"{'rejected':<{width + 2}}{self.rejected:>10}")
        lines += [f"  {reason:<{width}}{count:>10}" for reason, count in self.rejections.items()]
        return "\n".join(lines)


def iter_validated(
    source: Source, tokenizer=None, settings: TokenizeSettings | None = None
) -> Iterator[Checked | Rejection]:
    """Yield `(pair, tokenized or None)` or a located `Rejection` for every input record, in order.

    Without a tokenizer only the row checks run (no length limits apply).
    """
    settings = settings or TokenizeSettings()
    pairs = iter_pairs(source) if isinstance(source, str | Path) else normalize_rows(source)
    for index, item in enumerate(pairs):
        if isinstance(item, Rejection) or tokenizer is None:
            yield item if isinstance(item, Rejection) else (item, None)
            continue
        try:
            yield item, tokenize_pair(item, tokenizer, settings)
        except Rejection as rejection:
            yield rejection.at(index, item.pair_id)


def tokenize_source(
    source: Source,
    tokenizer,
    settings: TokenizeSettings | None = None,
    summary: Summary | None = None,
    *,
    strict: bool = False,
    content: ContentHashes | None = None,
) -> list[TokenizedPair]:
    """The accepted, tokenised pairs of `source` in input order; every row is counted in `summary`.

    `strict` raises the first rejected row's (located) `Rejection` instead of counting it.
    `content` collects each accepted pair's content keys, in the same order (`data.overlap`).
    """
    summary = summary if summary is not None else Summary()
    pairs: list[TokenizedPair] = []
    for item in iter_validated(source, tokenizer, settings):
        summary.add(item)
        if isinstance(item, Rejection):
            if strict:
                raise item
            continue
        pairs.append(item[1])
        if content is not None:
            content.add(item[0])
    return pairs
