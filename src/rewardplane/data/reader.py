"""Stream preference rows from JSONL, JSON arrays, Parquet, Arrow and Hub-format folders.

Memory stays flat in the input size: JSONL is read line by line (gzip-compressed JSONL and JSON,
`*.jsonl.gz`, are decompressed as they are read) (a line over `MAX_ROW_BYTES`
is skipped in chunks, an `oversize` rejection), JSON arrays are decoded element by element
from ijson's event stream (linear time), Parquet and Arrow in record batches. A folder is a
`datasets.save_to_disk` dataset (dict) or `load_dataset`-style data files (Parquet shards
such as `data/train-00000-of-00002.parquet`); `FOLDER:SPLIT` picks a split (default `train`).
The only state that grows is the set of pair ids already seen (`SeenIds`: 16 bytes per
accepted row), which duplicate detection needs.

`source_index` is the 0-based position of a record in the input: the n-th non-blank JSONL
line, array element or Parquet row (across a folder's files, in reading order). It is the same
for the same data in any format.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np

from rewardplane.core.errors import UsageError
from rewardplane.data import reasons as R
from rewardplane.data.normalize import normalize_row
from rewardplane.data.reasons import Rejection
from rewardplane.data.records import PreferencePair

FORMATS = ("jsonl", "json", "parquet", "arrow", "hf_dir")
PARQUET_BATCH_ROWS = 2048
MAX_ROW_BYTES = 16 << 20
"""A JSONL line longer than this is rejected `oversize` (read in chunks, never held whole)."""
_LINE_CHUNK = 1 << 16
_WHITESPACE = " \t\r\n"
_GZIP_MAGIC = b"\x1f\x8b"
_FILE_SUFFIXES = {
    ".jsonl": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".arrow": "arrow",
}
# load_dataset's split keywords (datasets.data_files): a file or folder named after one belongs to it
_SPLIT_WORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "val", "dev"),
    "test": ("test", "testing", "eval", "evaluation"),
}


class UnterminatedInput(UsageError):
    """The input ended inside a JSON array: every complete element before it was read and checked."""

    code = "unterminated"


def resolve_source(path: str | Path) -> tuple[Path, str | None]:
    """(path, split): `DIR:SPLIT` selects a split of a Hub-format folder (default `train`)."""
    candidate = Path(path)
    if candidate.exists():
        return candidate, None
    base, sep, split = str(path).rpartition(":")
    if sep and split and Path(base).is_dir():
        return Path(base), split
    return candidate, None


def source_exists(path: str | Path) -> bool:
    return resolve_source(path)[0].exists()


def detect_format(path: str | Path) -> str:
    """`hf_dir` for a folder; `parquet` / `arrow` by suffix or magic bytes; `json` if the file starts
    with `[`, else `jsonl`."""
    path, _split = resolve_source(path)
    if path.is_dir():
        return "hf_dir"
    if path.suffix.lower() in (".parquet", ".pq"):
        return "parquet"
    if path.suffix.lower() == ".arrow":
        return "arrow"
    with _open_bytes(path) as handle:
        head = handle.read(4096)
    if head.startswith(b"PAR1") or head.startswith(b"ARROW1") or head.startswith(b"\xff\xff\xff\xff"):
        if _is_gzip(path):
            raise UsageError(f"{path}: a gzip-compressed Parquet or Arrow file; unpack it first (gunzip)")
        return "parquet" if head.startswith(b"PAR1") else "arrow"
    stripped = head.lstrip(b"\xef\xbb\xbf" + _WHITESPACE.encode())
    return "json" if stripped.startswith(b"[") else "jsonl"


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as handle:
        return handle.read(2) == _GZIP_MAGIC


def _open_bytes(path: str | Path):
    """The file's bytes, decompressed as they are read when it is gzip (by content, not by name)."""
    return gzip.open(path, "rb") if _is_gzip(Path(path)) else open(path, "rb")


def input_files(path: str | Path) -> list[Path]:
    """The files a source reads, in reading order (one for a file, the split's shards for a folder)."""
    path, split = resolve_source(path)
    if not path.is_dir():
        return [path]
    return _hub_files(path, split or "train")


def input_sha256(path: str | Path) -> str:
    """SHA-256 of a file, or of the (relative name, SHA-256) list of a folder split's files."""
    from rewardplane.core.hashing import sha256_file, sha256_json

    path_only, _split = resolve_source(path)
    if not path_only.is_dir():
        return sha256_file(path_only)
    return sha256_json([[str(f.relative_to(path_only)), sha256_file(f)] for f in input_files(path)])


def input_name(path: str | Path) -> str:
    """The source's base name (with `:SPLIT` for a folder split), for manifests: no absolute paths."""
    base, split = resolve_source(path)
    return f"{base.name}:{split}" if split else base.name


def iter_rows(path: str | Path) -> Iterator[Any]:
    """Yield every record's decoded value in input order.

    A JSONL line that is not valid JSON, nests too deeply or is longer than `MAX_ROW_BYTES`
    yields a Rejection in its place (the rest of the file is still read). A JSON array that
    stops before its closing `]` yields every complete element, then raises
    `UnterminatedInput`; other unparseable arrays, Parquet and Arrow files raise `UsageError`:
    there is no row boundary to recover from. A folder (a `save_to_disk` dataset or
    dataset dict, or `load_dataset`-style data files / Parquet shards) yields its split's rows,
    file after file.
    """
    for file in input_files(path):
        yield from _iter_file(file)


def _iter_file(path: Path) -> Iterator[Any]:
    fmt = detect_format(path)
    if fmt == "parquet":
        yield from _iter_parquet(path)
    elif fmt == "arrow":
        yield from _iter_arrow(path)
    elif fmt == "json":
        yield from _iter_json_array(path)
    else:
        yield from _iter_jsonl(path)


def _hub_files(root: Path, split: str) -> list[Path]:
    """A split's data files in a Hub-format folder.

    - `datasets.Dataset.save_to_disk`: `state.json` lists the Arrow files (the split is ignored);
    - `DatasetDict.save_to_disk`: `dataset_dict.json` names the splits, one sub-folder each;
    - otherwise `load_dataset`'s data-files rule: JSONL / JSON / Parquet / Arrow files anywhere
      below (hidden folders skipped) whose name or folder is a split keyword (`train-*.parquet`,
      `data/train-00000-of-00002.parquet`, `test/part.jsonl`, ...); with no split names at all,
      every file is `train`.
    """
    import json as _json

    if (root / "dataset_dict.json").is_file():
        splits = _json.loads((root / "dataset_dict.json").read_text()).get("splits") or []
        if split not in splits:
            raise UsageError(f"{root}: no split {split!r} (splits: {', '.join(splits)}); use {root}:SPLIT")
        return _hub_files(root / split, split)
    if (root / "state.json").is_file():
        state = _json.loads((root / "state.json").read_text())
        files = [root / entry["filename"] for entry in state.get("_data_files") or []]
        if not files:
            raise UsageError(f"{root}: state.json lists no data files")
        return files
    found = sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and _data_suffix(p) in _FILE_SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(root).parts)
        and p.name not in ("dataset_info.json", "state.json", "dataset_dict.json")
    )
    if not found:
        raise UsageError(f"{root}: no JSONL / JSON / Parquet / Arrow data files in this folder")
    by_split: dict[str, list[Path]] = {}
    for file in found:
        by_split.setdefault(_split_of(file.relative_to(root)), []).append(file)
    if set(by_split) == {None}:
        by_split = {"train": by_split[None]}
    if split not in by_split:
        named = sorted(k for k in by_split if k)
        raise UsageError(f"{root}: no split {split!r} (splits: {', '.join(named)}); use {root}:SPLIT")
    return by_split[split]


def _data_suffix(path: Path) -> str:
    """`.jsonl` for `x.jsonl` and `x.jsonl.gz` alike."""
    suffixes = [s.lower() for s in path.suffixes]
    return suffixes[-2] if len(suffixes) > 1 and suffixes[-1] == ".gz" else path.suffix.lower()


def _split_of(relative: Path) -> str | None:
    import re

    for part in reversed([*relative.parent.parts, relative.name]):
        for split, words in _SPLIT_WORDS.items():
            for word in words:
                if re.match(rf"^{word}(?:$|[-._])", part.lower()) or re.search(
                    rf"[-._]{word}(?:$|[-._])", part.lower()
                ):
                    return split
    return None


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
        except RecursionError:  # a JSONL row just under the decoder's limit, nested metadata
            yield Rejection(R.SCHEMA, "row nests JSON too deeply", source_index=index)
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


def _iter_jsonl(path: str | Path, max_row_bytes: int | None = None) -> Iterator[Any]:
    limit = MAX_ROW_BYTES if max_row_bytes is None else max_row_bytes
    with _open_bytes(path) as handle:
        first = True
        while True:
            line = handle.readline(limit + 1)
            if not line:
                return
            if first:
                line = line.removeprefix(b"\xef\xbb\xbf")
                first = False
            if len(line) > limit and not line.endswith(b"\n"):
                size = len(line) + _skip_line(handle)
                yield Rejection(R.OVERSIZE, f"line is {size} bytes, over the {limit}-byte row limit")
                continue
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
                yield Rejection(R.SCHEMA, f"line is not valid JSON: {exc}")
            except RecursionError:
                yield Rejection(R.SCHEMA, "line nests JSON too deeply")


def _skip_line(handle) -> int:
    """Read past the rest of the current line in bounded chunks; return how many bytes it had."""
    skipped = 0
    while chunk := handle.readline(_LINE_CHUNK):
        skipped += len(chunk)
        if chunk.endswith(b"\n"):
            break
    return skipped


def _iter_json_array(path: str | Path) -> Iterator[Any]:
    """Decode `[v, v, ...]` one element at a time from ijson's event stream (linear time).

    Elements are built here from `basic_parse` events rather than with `ijson.items`, whose
    per-event prefix strings make deep nesting quadratic: an element nested deeper than
    `MAX_DEPTH` is skipped and yields a `schema` Rejection instead.
    """
    import ijson

    with _open_bytes(path) as handle:
        if handle.read(3) != b"\xef\xbb\xbf":
            handle.seek(0)
        count = 0
        try:
            # numbers as int / Decimal (use_float would refuse integers beyond 64 bits); Decimals
            # become floats below, so 1e400 is inf as in json.loads
            events = ijson.basic_parse(handle)
            first = next(events, None)
            if first is None or first[0] != "start_array":
                raise UsageError(f"{path}: not a valid JSON array (expected '[')")
            for value in _build_elements(events):
                count += 1
                yield value
        except ijson.IncompleteJSONError as exc:
            text = str(exc).lower()
            if "incomplete" in text or "premature" in text:
                raise UnterminatedInput(
                    f"{path}: the JSON array is unterminated (input ends after {count} complete elements,"
                    " which were read and checked)"
                ) from None
            raise UsageError(f"{path}: not a valid JSON array ({_one_line(exc)})") from None
        except ijson.JSONError as exc:
            raise UsageError(f"{path}: not a valid JSON array ({_one_line(exc)})") from None


MAX_DEPTH = 256
"""Deepest nesting of one row (arrays and objects); deeper rows are `schema` rejections."""


def _build_elements(events: Iterator[tuple[str, Any]]) -> Iterator[Any]:
    """Top-level array elements from `basic_parse` events that follow its `start_array`."""
    stack: list[Any] = []  # open containers
    keys: list[Any] = []  # the pending key of each open container (None for arrays)
    skipping = 0  # > 0 while skipping an element nested deeper than MAX_DEPTH
    for event, value in events:
        if skipping:
            if event == "start_map" or event == "start_array":
                skipping += 1
            elif event == "end_map" or event == "end_array":
                skipping -= 1
                if not skipping:
                    yield Rejection(R.SCHEMA, f"row nests JSON deeper than {MAX_DEPTH} levels")
            continue
        if event == "map_key":
            keys[-1] = value
            continue
        if event == "number" and type(value) is Decimal:
            value = float(value)
        if event == "start_map" or event == "start_array":
            if len(stack) >= MAX_DEPTH:  # skip to the end of this element (its open containers too)
                skipping = len(stack) + 1
                stack.clear()
                keys.clear()
                continue
            stack.append({} if event == "start_map" else [])
            keys.append(None)
            continue
        if event == "end_map" or event == "end_array":
            if not stack:  # the closing bracket of the top-level array
                for _trailing in events:  # ijson raises on data after it
                    pass
                return
            value = stack.pop()
            keys.pop()
        if not stack:
            yield value
        elif keys[-1] is None and type(stack[-1]) is list:
            stack[-1].append(value)
        else:
            stack[-1][keys[-1]] = value


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


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


def _iter_arrow(path: str | Path) -> Iterator[Any]:
    """An Arrow IPC stream (what `datasets.save_to_disk` writes) or IPC file, batch by batch."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    try:
        with pa.memory_map(str(path)) as source:
            try:
                reader = ipc.open_stream(source)
                batches = iter(reader)
            except pa.ArrowInvalid:
                source.seek(0)
                file_reader = ipc.open_file(source)
                batches = (file_reader.get_batch(i) for i in range(file_reader.num_record_batches))
            for batch in batches:
                for start in range(0, batch.num_rows, PARQUET_BATCH_ROWS):
                    yield from batch.slice(start, PARQUET_BATCH_ROWS).to_pylist()
    except (pa.ArrowException, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise UsageError(f"{path}: cannot read Arrow: {exc}") from None
