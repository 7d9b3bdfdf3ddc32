"""Stream preference rows from JSONL, JSON arrays and Parquet, and normalise them.

Memory stays flat in the input size: JSONL is read line by line, JSON arrays are decoded
element by element from a bounded buffer, Parquet is read in record batches. The only state
that grows is the set of pair ids already seen (`SeenIds`: 16 bytes per accepted row),
which duplicate detection needs.

`source_index` is the 0-based position of a record in the input: the n-th non-blank JSONL
line, array element or Parquet row. It is the same for the same data in any format.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rewardkit.core.errors import UsageError
from rewardkit.data import reasons as R
from rewardkit.data.normalize import normalize_row
from rewardkit.data.reasons import Rejection
from rewardkit.data.records import PreferencePair

FORMATS = ("jsonl", "json", "parquet")
PARQUET_BATCH_ROWS = 2048
_CHUNK_CHARS = 1 << 20
_WHITESPACE = " \t\r\n"
_DELIMITERS = ",]" + _WHITESPACE


def detect_format(path: str | Path) -> str:
    """`parquet` by suffix or magic bytes; otherwise `json` if the file starts with `[`, else `jsonl`."""
    path = Path(path)
    if path.suffix.lower() in (".parquet", ".pq"):
        return "parquet"
    with open(path, "rb") as handle:
        head = handle.read(4096)
    if head.startswith(b"PAR1"):
        return "parquet"
    stripped = head.lstrip(b"\xef\xbb\xbf" + _WHITESPACE.encode())
    return "json" if stripped.startswith(b"[") else "jsonl"


def iter_rows(path: str | Path) -> Iterator[Any]:
    """Yield every record's decoded value in input order.

    A JSONL line that is not valid JSON yields a `schema` Rejection in its place (the rest of
    the file is still read). A JSON array or Parquet file that cannot be parsed at all raises
    `UsageError`: there is no row boundary to recover from.
    """
    fmt = detect_format(path)
    if fmt == "parquet":
        yield from _iter_parquet(path)
    elif fmt == "json":
        with open(path, encoding="utf-8-sig") as handle:
            yield from _iter_json_array(handle, str(path))
    else:
        yield from _iter_jsonl(path)


def iter_pairs(path: str | Path) -> Iterator[PreferencePair | Rejection]:
    """Yield one `PreferencePair` or one located `Rejection` per record of the file, in order."""
    return normalize_rows(iter_rows(path))


def normalize_rows(rows: Iterable[Any]) -> Iterator[PreferencePair | Rejection]:
    """Yield one `PreferencePair` or one located `Rejection` per decoded row, in order.

    Duplicate ids are rejected on their second and later occurrences; an id counts as taken
    once a row carrying it has passed the row checks. A row may itself be a `Rejection` (a
    JSONL line that did not decode), which is located and passed on.
    """
    seen = SeenIds()
    for index, row in enumerate(rows):
        if isinstance(row, Rejection):
            yield row.at(index)
            continue
        try:
            pair = normalize_row(row)
        except Rejection as rejection:
            yield rejection.at(index)
            continue
        if not seen.add(pair.pair_id):
            yield Rejection(
                R.DUPLICATE_ID,
                f"pair id {pair.pair_id!r} was already used by an earlier row",
                source_index=index,
                pair_id=pair.pair_id,
            )
            continue
        yield pair


class SeenIds:
    """The pair ids seen so far, in about 16 bytes each (a 128-bit BLAKE2b digest per id).

    Recent digests live in a small Python set; every `batch` ids they are merged into two
    uint64 arrays (high and low halves) sorted by the high half and searched with
    `searchsorted`; equal high halves are scanned for the low half. A Python set of a
    million ids would cost ~100 MB; this costs ~16 MB. Two different ids collide with
    probability ~n^2 / 2^129 (negligible: ~1e-27 for a million ids).
    """

    def __init__(self, batch: int = 1 << 14) -> None:
        self._batch = batch
        self._recent: set[bytes] = set()
        self._high = np.empty(0, dtype=np.uint64)
        self._low = np.empty(0, dtype=np.uint64)

    def __len__(self) -> int:
        return len(self._recent) + len(self._high)

    def add(self, pair_id: str) -> bool:
        """Record `pair_id`; False if it was already there."""
        digest = hashlib.blake2b(pair_id.encode("utf-8"), digest_size=16).digest()
        if digest in self._recent:
            return False
        if len(self._high):
            high, low = np.frombuffer(digest, dtype=np.uint64)
            at = int(np.searchsorted(self._high, high))
            while at < len(self._high) and self._high[at] == high:
                if self._low[at] == low:
                    return False
                at += 1
        self._recent.add(digest)
        if len(self._recent) >= self._batch:
            self._merge()
        return True

    def _merge(self) -> None:
        halves = np.frombuffer(b"".join(self._recent), dtype=np.uint64).reshape(-1, 2)
        high = np.concatenate([self._high, halves[:, 0]])
        low = np.concatenate([self._low, halves[:, 1]])
        order = np.argsort(high, kind="stable")  # timsort: a sorted run plus a short one, ~linear
        self._high, self._low = high[order], low[order]
        self._recent.clear()


def _iter_jsonl(path: str | Path) -> Iterator[Any]:
    with open(path, "rb") as handle:
        first = True
        for line in handle:
            if first:
                line = line.removeprefix(b"\xef\xbb\xbf")
                first = False
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
                yield Rejection(R.SCHEMA, f"line is not valid JSON: {exc}")


def _iter_json_array(handle, name: str) -> Iterator[Any]:
    """Decode `[v, v, ...]` one element at a time from a bounded, refilled buffer."""
    decoder = json.JSONDecoder()
    buf, pos, eof = "", 0, False

    def refill() -> bool:
        nonlocal buf, pos, eof
        if eof:
            return False
        more = handle.read(_CHUNK_CHARS)
        eof = not more
        buf, pos = buf[pos:] + more, 0
        return bool(more)

    def next_char() -> str:
        nonlocal pos
        while True:
            while pos < len(buf) and buf[pos] in _WHITESPACE:
                pos += 1
            if pos < len(buf):
                return buf[pos]
            if not refill():
                return ""

    def fail(what: str) -> UsageError:
        return UsageError(f"{name}: not a valid JSON array ({what})")

    if next_char() != "[":
        raise fail("expected '['")
    pos += 1
    first = True
    while True:
        char = next_char()
        if char == "]":
            pos += 1
            if next_char():
                raise fail("data after the closing ']'")
            return
        if not first:
            if char != ",":
                raise fail(f"expected ',' or ']' but found {char!r}" if char else "unexpected end of file")
            pos += 1
            next_char()
        while True:
            try:
                value, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as exc:
                if refill():
                    continue
                raise fail(exc.msg) from None
            # a number cut by the buffer's end ("-1." of "-1.5e3") decodes as a shorter number
            cut = end >= len(buf) or (_is_number(value) and buf[end] not in _DELIMITERS)
            if cut and refill():
                continue
            break
        pos = end
        first = False
        yield value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _iter_parquet(path: str | Path) -> Iterator[Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            yield from batch.to_pylist()
    except (pa.ArrowException, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise UsageError(f"{path}: cannot read Parquet: {exc}") from None
