"""One pass over an input file: normalise, optionally tokenise, count rejections per reason.

`iter_validated` is the pipeline every data command runs; `Summary` is what `validate`
prints and `prepare` records in its manifest.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rewardkit.data.reader import iter_pairs
from rewardkit.data.reasons import Rejection, empty_counts
from rewardkit.data.records import PreferencePair, TokenizedPair
from rewardkit.data.tokenize import TokenizeSettings, tokenize_pair

Checked = tuple[PreferencePair, TokenizedPair | None]


@dataclass
class Summary:
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

    def to_json(self) -> dict:
        return {
            "rows": self.rows,
            "valid": self.valid,
            "rejected": self.rejected,
            "rejections": dict(self.rejections),
        }

    def table(self) -> str:
        """The summary table `rewardkit data validate` prints (every reason, zeros included)."""
        width = max(len(reason) for reason in self.rejections) + 2
        lines = [f"{'rows':<{width + 2}}{self.rows:>10}", f"{'valid':<{width + 2}}{self.valid:>10}"]
        lines.append(f"{'rejected':<{width + 2}}{self.rejected:>10}")
        lines += [f"  {reason:<{width}}{count:>10}" for reason, count in self.rejections.items()]
        return "\n".join(lines)


def iter_validated(
    path: str | Path, tokenizer=None, settings: TokenizeSettings | None = None
) -> Iterator[Checked | Rejection]:
    """Yield `(pair, tokenized or None)` or a located `Rejection` for every input record, in order."""
    settings = settings or TokenizeSettings()
    for index, item in enumerate(iter_pairs(path)):
        if isinstance(item, Rejection) or tokenizer is None:
            yield item if isinstance(item, Rejection) else (item, None)
            continue
        try:
            yield item, tokenize_pair(item, tokenizer, settings)
        except Rejection as rejection:
            yield rejection.at(index, item.pair_id)
