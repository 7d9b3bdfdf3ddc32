"""Training-data overlap: which evaluated pairs a model was trained on.

An evaluation on pairs the model was trained on measures memory, not generalisation, and looks
better than it is (the tour once reported 0.895 for a model whose honest accuracy was 0.832,
and `compare` called it significantly better than a properly trained one). So a checkpoint
records the content of every pair it trained on, and `rewardplane eval` / `compare` count the
evaluated pairs found there.

Content, not ids: the same row under another id (a re-generated file, a copied dataset, a
duplicate inside one file that a split put on both sides) is the same training signal. Each
pair gives three keys, the first 8 bytes of a SHA-256 over canonical JSON of the normalised
messages (`PreferencePair`, so the row's shape, explicit or implicit prompt, does not matter):

- the pair: prompt + {chosen, rejected} in either order (a pair with its label flipped was
  trained on all the same);
- each response with its prompt: prompt + chosen, prompt + rejected.

The record is `training_data.npz` beside the weights: two sorted arrays of unique uint64 keys
(pairs, responses), 8 bytes a key: 100k training pairs take about 2.4 MB, where a hex list in
JSON would take 6 MB. 64-bit keys make a false match between 10^5 training pairs and 10^4
evaluated ones a 1-in-10^10 event. Its size and SHA-256 sit in the checkpoint's metadata
(`training_data`), and a load checks them.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rewardplane.core.errors import UsageError
from rewardplane.core.hashing import canonical_json, sha256_bytes
from rewardplane.data.records import PreferencePair

FILE = "training_data.npz"
FORMAT = "rewardplane.training_data/v1"
KEY_RULE = (
    "sha256(canonical_json(...))[:8]: pair = {prompt, responses: sorted}; response = [prompt, response]"
)


def _key(obj: Any) -> int:
    return int.from_bytes(hashlib.sha256(canonical_json(obj)).digest()[:8], "big")


def content_keys(pair: PreferencePair) -> tuple[int, int, int]:
    """(pair key, prompt + chosen key, prompt + rejected key) of one normalised pair."""
    responses = sorted([pair.chosen, pair.rejected], key=canonical_json)
    return (
        _key({"prompt": pair.prompt, "responses": responses}),
        _key([pair.prompt, pair.chosen]),
        _key([pair.prompt, pair.rejected]),
    )


@dataclass
class ContentHashes:
    """The keys of pairs as the data pipeline accepts them, in order (`tokenize_source(content=...)`)."""

    pairs: list[int] = field(default_factory=list)
    chosen: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)

    def add(self, pair: PreferencePair) -> None:
        keys = content_keys(pair)
        self.pairs.append(keys[0])
        self.chosen.append(keys[1])
        self.rejected.append(keys[2])

    def record(self) -> TrainingContent:
        """What a checkpoint keeps of these pairs: the unique keys, sorted."""
        as_array = lambda keys: np.unique(np.asarray(keys, dtype=np.uint64))  # noqa: E731
        return TrainingContent(as_array(self.pairs), as_array(self.chosen + self.rejected))


class TrainingDataError(UsageError):
    """A checkpoint's training-data record does not match its metadata (a torn or edited file)."""

    code = "training_data_mismatch"


@dataclass(frozen=True)
class TrainingContent:
    """Sorted unique keys of the pairs and of the prompt + response texts a model was trained on."""

    pairs: np.ndarray
    responses: np.ndarray

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        np.savez(buffer, format=np.array(FORMAT), pairs=self.pairs, responses=self.responses)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> TrainingContent:
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            if str(arrays["format"]) != FORMAT:
                raise TrainingDataError(f"not a {FORMAT} record")
            return cls(arrays["pairs"].astype(np.uint64), arrays["responses"].astype(np.uint64))

    def union(self, other: TrainingContent) -> TrainingContent:
        """A model trained on both (a resume onto new data)."""
        return TrainingContent(
            np.union1d(self.pairs, other.pairs).astype(np.uint64),
            np.union1d(self.responses, other.responses).astype(np.uint64),
        )

    def metadata(self, data: bytes) -> dict[str, Any]:
        """The checkpoint metadata entry for `data` (this record's bytes)."""
        return {
            "file": FILE,
            "format": FORMAT,
            "keys": KEY_RULE,
            "pairs": int(self.pairs.size),
            "responses": int(self.responses.size),
            "size": len(data),
            "sha256": sha256_bytes(data),
        }

    def find(self, evaluated: ContentHashes) -> Overlap:
        """Which of `evaluated`'s pairs (and responses) are in this record."""
        pairs = np.isin(np.asarray(evaluated.pairs, dtype=np.uint64), self.pairs)
        chosen = np.isin(np.asarray(evaluated.chosen, dtype=np.uint64), self.responses)
        rejected = np.isin(np.asarray(evaluated.rejected, dtype=np.uint64), self.responses)
        return Overlap(
            checked=True,
            in_training=[bool(x) for x in pairs],
            response_in_training=[bool(x) for x in chosen | rejected],
            training_pairs=int(self.pairs.size),
        )


def read_training_content(directory: str | Path, meta: dict[str, Any]) -> TrainingContent | str:
    """A checkpoint's record, checked against its metadata; else the reason there is none to check."""
    entry = meta.get("training_data")
    if not isinstance(entry, dict):
        return (
            "the model records no training-data hashes (a checkpoint or export written before they were"
            " recorded, or a Hugging Face directory)"
        )
    path = Path(directory) / str(entry.get("file", FILE))
    try:
        data = path.read_bytes()
    except OSError:
        return f"{path} is missing (the checkpoint records it)"
    if len(data) != entry.get("size") or sha256_bytes(data) != entry.get("sha256"):
        raise TrainingDataError(
            f"{path}: size or sha256 differs from the checkpoint's metadata (the file is corrupt)"
        )
    return TrainingContent.from_bytes(data)


@dataclass(frozen=True)
class Overlap:
    """The evaluated pairs found in the model's training data (or why that could not be checked)."""

    checked: bool
    reason: str | None = None
    in_training: list[bool] | None = None
    response_in_training: list[bool] | None = None
    training_pairs: int | None = None

    @classmethod
    def unchecked(cls, reason: str) -> Overlap:
        return cls(checked=False, reason=reason)

    @property
    def pairs(self) -> int | None:
        """Evaluated pairs that are training pairs; None when not checked (never a claimed 0)."""
        return None if self.in_training is None else sum(self.in_training)

    def summary(self) -> dict[str, Any]:
        """`summary.json`'s `train_overlap`."""
        if not self.checked:
            return {"checked": False, "reason": self.reason}
        return {
            "checked": True,
            "pairs": self.pairs,
            "evaluated": len(self.in_training or []),
            "pairs_with_a_training_response": sum(self.response_in_training or []),
            "training_pairs": self.training_pairs,
        }


def is_clean(entry: dict[str, Any] | None) -> bool:
    """A `train_overlap` entry that was checked and found no evaluated pair in the training data."""
    return bool(entry) and bool(entry.get("checked")) and entry.get("pairs") == 0


def overlap_line(entry: dict[str, Any], who: str = "the model") -> str:
    """The one line `eval`, `compare` and training say about a `train_overlap` entry (a warning
    unless `is_clean`)."""
    if not entry.get("checked"):
        return f"overlap with {who}'s training data could not be checked: {entry.get('reason')}"
    n, found = entry["evaluated"], entry["pairs"]
    responses = entry.get("pairs_with_a_training_response")
    shared = f" ({responses} share a prompt and a response with training pairs)" if responses else ""
    if found:
        return (
            f"{found} of {n} evaluated pairs are in {who}'s training data{shared}: on those the accuracy"
            " measures memory, not generalisation"
        )
    return f"training overlap: none of the {n} evaluated pairs is in {who}'s training data{shared}"
