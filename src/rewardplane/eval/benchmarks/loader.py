"""Read a local copy of a public reward-model benchmark, in its published schema.

Sources: a Parquet file, a JSON array (or an object whose only list value is the rows), a
JSONL file, or a folder written by `datasets`' `save_to_disk` (a `Dataset`, or a
`DatasetDict` with one split or a split named as `DIR:SPLIT`). Nothing is downloaded.

A file in another schema is refused with one line naming the missing columns
(`benchmark_schema`). Inside a file in the right schema, a row that cannot be scored is
rejected with one of the data pipeline's reason codes (`rewardplane.data.reasons`) and
counted, never repaired: `schema` (a field of the wrong type or shape), `missing_field`
(a required value is null), `empty_completion` (a blank response), `duplicate_id`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewardplane.core.errors import UsageError
from rewardplane.data import reasons as R
from rewardplane.data.reasons import Rejection

SCHEMA_CODE = "benchmark_schema"


@dataclass(frozen=True)
class Item:
    """One benchmark example: a prompt with its chosen and rejected responses, in the benchmark's order."""

    id: str
    subset: str
    prompt: str
    chosen: tuple[str, ...]
    rejected: tuple[str, ...]
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "subset": self.subset,
            "prompt": self.prompt,
            "chosen": list(self.chosen),
            "rejected": list(self.rejected),
            **({"extra": self.extra} if self.extra else {}),
        }


def _is_datasets_dir(path: Path) -> bool:
    return path.is_dir() and any(
        (path / name).is_file() for name in ("dataset_info.json", "state.json", "dataset_dict.json")
    )


def read_table(path: str | Path) -> tuple[list[str], Iterator[dict[str, Any]]]:
    """(column names, rows as dicts) of a local Parquet / JSON / JSONL file or `save_to_disk` folder.

    A `DatasetDict` folder with several splits needs one named, `DIR:SPLIT` (RewardBench's
    `raw` and `filtered` splits overlap; the benchmark is `filtered`).
    """
    split = None
    text = str(path)
    if not Path(text).exists() and ":" in text:
        base, _, split = text.rpartition(":")
        if Path(base).is_dir():
            path = base
        else:
            split = None
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory", code="no_data")
    if path.is_dir():
        if not _is_datasets_dir(path):
            raise UsageError(
                f"{path}: a folder that is not a `datasets` save_to_disk folder "
                "(no dataset_info.json, state.json or dataset_dict.json)",
                code=SCHEMA_CODE,
            )
        return _read_datasets(path, split)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _read_parquet(path)
    if suffix == ".jsonl":
        return _read_jsonl(path)
    if suffix == ".json":
        return _read_json(path)
    raise UsageError(f"{path}: unknown file type {suffix!r} (use .parquet, .json, .jsonl)", code="no_data")


def _read_datasets(path: Path, split: str | None) -> tuple[list[str], Iterator[dict[str, Any]]]:
    from datasets import Dataset, DatasetDict, load_from_disk

    loaded = load_from_disk(str(path))
    if isinstance(loaded, DatasetDict):
        if split is None and len(loaded) > 1:
            raise UsageError(
                f"{path}: a DatasetDict with splits {', '.join(sorted(loaded))}; name one as {path}:SPLIT",
                code=SCHEMA_CODE,
            )
        if split is not None and split not in loaded:
            raise UsageError(
                f"{path}: no split {split!r} (have: {', '.join(sorted(loaded))})", code=SCHEMA_CODE
            )
        parts: list[Dataset] = [loaded[split if split is not None else next(iter(loaded))]]
    else:
        if split is not None:
            raise UsageError(f"{path}: a single Dataset, it has no split {split!r}", code=SCHEMA_CODE)
        parts = [loaded]
    columns = list(parts[0].column_names) if parts else []

    def rows() -> Iterator[dict[str, Any]]:
        for part in parts:
            yield from part

    return columns, rows()


def _read_parquet(path: Path) -> tuple[list[str], Iterator[dict[str, Any]]]:
    import pyarrow.parquet as pq

    handle = pq.ParquetFile(path)
    columns = list(handle.schema_arrow.names)

    def rows() -> Iterator[dict[str, Any]]:
        for batch in handle.iter_batches(batch_size=1024):
            yield from batch.to_pylist()

    return columns, rows()


def _read_jsonl(path: Path) -> tuple[list[str], Iterator[dict[str, Any]]]:
    rows: list[Any] = []
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise UsageError(f"{path}:{line_no}: not JSON ({exc.msg})", code=SCHEMA_CODE) from None
    return _columns(rows), iter(rows)


def _read_json(path: Path) -> tuple[list[str], Iterator[dict[str, Any]]]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not JSON ({exc.msg})", code=SCHEMA_CODE) from None
    if isinstance(value, dict):
        lists = [v for v in value.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise UsageError(f"{path}: a JSON object, not an array of rows", code=SCHEMA_CODE)
        value = lists[0]
    if not isinstance(value, list):
        raise UsageError(f"{path}: not a JSON array of rows", code=SCHEMA_CODE)
    return _columns(value), iter(value)


def _columns(rows: list[Any]) -> list[str]:
    """Columns of a JSON file: the keys every object row has (what a table reader would see)."""
    objects = [row for row in rows if isinstance(row, dict)]
    if not objects:
        return []
    common = set(objects[0])
    for row in objects[1:]:
        common &= set(row)
    return [key for key in objects[0] if key in common]


def check_columns(path: str | Path, columns: list[str], required: tuple[str, ...], benchmark: str) -> None:
    missing = [name for name in required if name not in columns]
    if missing:
        raise UsageError(
            f"{path}: not in the {benchmark} schema: missing column(s) {', '.join(missing)} "
            f"(found: {', '.join(columns) or 'none'})",
            code=SCHEMA_CODE,
        )


# ---- per-row checks shared by the benchmark modules ------------------------------------------------
def text(row: dict[str, Any], name: str) -> str:
    value = row.get(name)
    if value is None:
        raise Rejection(R.MISSING_FIELD, f"{name} is null")
    if not isinstance(value, str):
        raise Rejection(R.SCHEMA, f"{name} is {type(value).__name__}, not a string")
    return value


def response(value: Any, name: str) -> str:
    if value is None:
        raise Rejection(R.MISSING_FIELD, f"{name} is null")
    if not isinstance(value, str):
        raise Rejection(R.SCHEMA, f"{name} is {type(value).__name__}, not a string")
    if not value.strip():
        raise Rejection(R.EMPTY_COMPLETION, f"{name} is empty")
    return value


def responses(
    row: dict[str, Any], name: str, *, exactly: int | None = None, at_least: int = 1
) -> tuple[str, ...]:
    value = row.get(name)
    if value is None:
        raise Rejection(R.MISSING_FIELD, f"{name} is null")
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list):
        raise Rejection(R.SCHEMA, f"{name} is {type(value).__name__}, not a list of strings")
    if exactly is not None and len(value) != exactly:
        raise Rejection(R.SCHEMA, f"{name} has {len(value)} responses, expected {exactly}")
    if len(value) < at_least:
        raise Rejection(R.SCHEMA, f"{name} has {len(value)} responses, expected at least {at_least}")
    return tuple(response(v, f"{name}[{i}]") for i, v in enumerate(value))


def item_id(row: dict[str, Any]) -> str:
    value = row.get("id")
    if value is None:
        raise Rejection(R.MISSING_FIELD, "id is null")
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise Rejection(R.SCHEMA, f"id is {type(value).__name__}")
    return str(value)
