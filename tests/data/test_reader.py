"""Readers: JSONL / JSON array / Parquet parity, streaming in bounded memory, duplicate ids."""

from __future__ import annotations

import json
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rewardplane.core.errors import UsageError
from rewardplane.data import reader
from rewardplane.data import reasons as R
from rewardplane.data.reader import detect_format, iter_pairs, iter_rows
from rewardplane.data.reasons import Rejection
from rewardplane.data.synth import generate_rows


def ultrafeedback_rows(n: int) -> list[dict]:
    """Rows in UltraFeedback-binarized's shape (one schema, so Parquet can hold them)."""
    rows = []
    for i in range(n):
        prompt = f"Question {i % 50}: name a fruit."
        rows.append(
            {
                "prompt": prompt,
                "prompt_id": None if i % 3 == 0 else f"p{i}",
                "chosen": [
                    {"role": "user", "content": prompt},
                    {"role": "assistant", "content": f"kiwi {i}"},
                ],
                "rejected": [
                    {"role": "user", "content": prompt},
                    {"role": "assistant", "content": f"red {i}"},
                ],
                "score_chosen": 8.0,
                "score_rejected": float(i % 7),
            }
        )
    return rows


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def as_json(items):
    return [item.to_json() for item in items]


def test_jsonl_json_and_parquet_give_identical_pairs(tmp_path):
    rows = ultrafeedback_rows(300)
    rows.append(dict(rows[10]))  # a duplicate: rejected in every format alike
    jsonl = write_jsonl(tmp_path / "d.jsonl", rows)
    array = tmp_path / "d.json"
    array.write_text(json.dumps(rows, indent=2))
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet, row_group_size=64)
    assert [detect_format(p) for p in (jsonl, array, parquet)] == ["jsonl", "json", "parquet"]
    expected = as_json(iter_pairs(jsonl))
    assert len(expected) == 301 and expected[-1]["reason"] == R.DUPLICATE_ID
    assert as_json(iter_pairs(array)) == expected
    assert as_json(iter_pairs(parquet)) == expected


def test_parquet_detected_by_magic_bytes(tmp_path):
    path = tmp_path / "data.bin"
    pq.write_table(pa.Table.from_pylist(ultrafeedback_rows(3)), path)
    assert detect_format(path) == "parquet" and len(list(iter_rows(path))) == 3


def test_jsonl_bad_line_is_a_schema_rejection_and_reading_continues(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"chosen": "a", "rejected": "b"}\n\n{not json\n  \n{"chosen": "c", "rejected": "d"}\n')
    items = list(iter_pairs(path))
    assert [getattr(item, "reason", "ok") for item in items] == ["ok", R.SCHEMA, "ok"]
    assert items[1].source_index == 1  # blank lines are not records


def test_duplicate_ids_rejected_on_second_and_later_occurrences(tmp_path):
    rows = [{"id": "x", "chosen": f"a{i}", "rejected": "b"} for i in range(3)] + [
        {"id": "y", "chosen": "a", "rejected": "b"}
    ]
    items = list(iter_pairs(write_jsonl(tmp_path / "d.jsonl", rows)))
    assert isinstance(items[0], type(items[3])) and not isinstance(items[0], Rejection)
    assert [(i.reason, i.source_index, i.pair_id) for i in items[1:3]] == [
        (R.DUPLICATE_ID, 1, "x"),
        (R.DUPLICATE_ID, 2, "x"),
    ]


def test_rejected_row_does_not_take_its_id(tmp_path):
    rows = [{"id": "x", "chosen": "a", "rejected": "a"}, {"id": "x", "chosen": "a", "rejected": "b"}]
    items = list(iter_pairs(write_jsonl(tmp_path / "d.jsonl", rows)))
    assert items[0].reason == R.IDENTICAL and items[0].pair_id == "x" and items[1].pair_id == "x"


def test_derived_ids_are_stable_across_runs_and_formats(tmp_path):
    rows = [{k: v for k, v in row.items() if k != "id"} for row in generate_rows(50, seed=3)]
    first = [p.pair_id for p in iter_pairs(write_jsonl(tmp_path / "a.jsonl", rows))]
    array = tmp_path / "a.json"
    array.write_text(json.dumps(rows))
    assert first == [p.pair_id for p in iter_pairs(array)]
    assert first == [p.pair_id for p in iter_pairs(write_jsonl(tmp_path / "b.jsonl", rows))]
    assert len(set(first)) == 50


def test_json_array_decoding(tmp_path):
    values = [{"a": [1, 2, {"b": "x , ]"}]}, 12345678901234567890, -1.5e3, "s\u00e9", [], {}, None, True]
    path = tmp_path / "a.json"
    path.write_text(" \n[ " + " ,\n".join(json.dumps(v) for v in values) + " ]\n")
    assert list(iter_rows(path)) == values
    path.write_text("[]")
    assert list(iter_rows(path)) == []


@pytest.mark.parametrize("text", ["[1 2]", "[1,]", "[1] x", "[{]"])
def test_broken_json_array_is_a_usage_error(tmp_path, text):
    path = tmp_path / "a.json"
    path.write_text(text)
    with pytest.raises(UsageError, match="not a valid JSON array"):
        list(iter_rows(path))


def test_broken_parquet_is_a_usage_error(tmp_path):
    path = tmp_path / "a.parquet"
    path.write_bytes(b"PAR1 garbage")
    with pytest.raises(UsageError, match="cannot read Parquet"):
        list(iter_rows(path))


def _peak_bytes(items) -> tuple[int, int]:
    tracemalloc.start()
    try:
        count = sum(1 for _ in items)
        return count, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet"])
def test_streaming_memory_is_bounded_by_a_row_not_the_file(tmp_path, monkeypatch, fmt):
    """8 MB of rows read with a peak of well under a tenth of that (bounded buffers, a few rows at a time)."""
    monkeypatch.setattr(reader, "PARQUET_BATCH_ROWS", 64)
    filler = "word " * 400
    rows = [
        {"id": f"r{i}", "prompt": filler, "chosen": f"yes {i}", "rejected": f"no {i}"} for i in range(4000)
    ]
    path = tmp_path / f"big.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=256)
    elif fmt == "json":
        path.write_text(json.dumps(rows))
    else:
        write_jsonl(path, rows)
    size = 4000 * len(filler)
    count, peak = _peak_bytes(iter_pairs(path))
    assert count == 4000
    assert peak < size / 10, f"peak {peak} bytes while streaming {size} bytes"


PUBLIC_SHAPES = {
    "hh_rlhf": {
        "chosen": "\n\nHuman: Name a fruit.\n\nAssistant: kiwi",
        "rejected": "\n\nHuman: Name a fruit.\n\nAssistant: red",
    },
    "ultrafeedback_binarized": {
        "prompt": "Name a fruit.",
        "prompt_id": "uf-0",
        "chosen": [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "kiwi"}],
        "rejected": [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "red"}],
        "messages": [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "kiwi"}],
        "score_chosen": 9.0,
        "score_rejected": 2.0,
    },
    "trl_standard": {"prompt": "Name a fruit.", "chosen": "kiwi", "rejected": "red"},
    "trl_conversational": {
        "prompt": [{"role": "user", "content": "Name a fruit."}],
        "chosen": [{"role": "assistant", "content": "kiwi"}],
        "rejected": [{"role": "assistant", "content": "red"}],
    },
    "trl_implicit_conversational": {
        "chosen": [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "kiwi"}],
        "rejected": [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "red"}],
    },
}


@pytest.mark.parametrize("fmt", ["jsonl", "json"])
@pytest.mark.parametrize("shape", sorted(PUBLIC_SHAPES))
def test_public_dataset_shapes_from_files(tmp_path, fmt, shape):
    """Files in the shapes of HH-RLHF, UltraFeedback-binarized and TRL's formats read as the same pair."""
    path = tmp_path / f"{shape}.{fmt}"
    if fmt == "json":
        path.write_text(json.dumps([PUBLIC_SHAPES[shape]]))
    else:
        write_jsonl(path, [PUBLIC_SHAPES[shape]])
    (pair,) = iter_pairs(path)
    assert pair.prompt == [{"role": "user", "content": "Name a fruit."}]
    assert pair.chosen == [{"role": "assistant", "content": "kiwi"}]
    assert pair.rejected == [{"role": "assistant", "content": "red"}]


def test_same_content_in_different_shapes_is_a_duplicate(tmp_path):
    """Id-less shapes normalise to the same content, hence the same deterministic id."""
    items = list(iter_pairs(write_jsonl(tmp_path / "all.jsonl", list(PUBLIC_SHAPES.values()))))
    assert items[1].pair_id == "uf-0" and items[1].metadata == {"score_chosen": 9.0, "score_rejected": 2.0}
    assert [getattr(item, "reason", None) for item in items] == [
        None,
        None,
        R.DUPLICATE_ID,
        R.DUPLICATE_ID,
        R.DUPLICATE_ID,
    ]
    assert {item.pair_id for i, item in enumerate(items) if i != 1} == {items[0].pair_id}


def test_seen_ids_is_exact_across_merges():
    seen = reader.SeenIds(batch=8)
    ids = [f"id-{i}" for i in range(100)]
    assert all(seen.add(pair_id) for pair_id in ids)
    assert len(seen) == 100
    assert not any(seen.add(pair_id) for pair_id in ids[::7])  # found in merged arrays and the recent set
    assert seen.add("id-100") and not seen.add("id-100")


def test_unterminated_array_yields_complete_elements_then_says_so(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('[{"chosen": "a", "rejected": "b"}, 2, {"chosen": "c", "rej')
    got = []
    with pytest.raises(reader.UnterminatedInput) as err:
        for row in iter_rows(path):
            got.append(row)
    assert got == [{"chosen": "a", "rejected": "b"}, 2]
    assert "unterminated" in err.value.message and "2 complete elements" in err.value.message
    assert isinstance(err.value, UsageError) and "\n" not in err.value.message


def test_deep_nesting_is_a_schema_rejection_not_a_crash(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    array = tmp_path / "a.json"
    array.write_text(f'[{deep}, {{"chosen": "a", "rejected": "b"}}]')
    items = list(iter_pairs(array))
    assert [getattr(i, "reason", "ok") for i in items] == [R.SCHEMA, "ok"]
    lines = tmp_path / "a.jsonl"
    lines.write_text(f'{{"chosen": {deep}, "rejected": "b"}}\n{{"chosen": "a", "rejected": "b"}}\n')
    items = list(iter_pairs(lines))
    assert [getattr(i, "reason", "ok") for i in items] == [R.SCHEMA, "ok"]
    # deep but under the limits: still a schema rejection (metadata must be plain JSON), never a crash
    moderate = "[" * 200 + "]" * 200
    lines.write_text(f'{{"chosen": "a", "rejected": "b", "metadata": {{"x": {moderate}}}}}\n')
    assert len(list(iter_pairs(lines))) == 1


def test_oversize_jsonl_line_is_rejected_without_being_held(tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "MAX_ROW_BYTES", 1 << 16)
    path = tmp_path / "a.jsonl"
    big = json.dumps({"chosen": "x" * (1 << 20), "rejected": "y"})
    path.write_text(f'{{"chosen": "a", "rejected": "b"}}\n{big}\n{{"chosen": "c", "rejected": "d"}}\n')
    tracemalloc.start()
    try:
        items = list(iter_pairs(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [getattr(i, "reason", "ok") for i in items] == ["ok", R.OVERSIZE, "ok"]
    assert items[1].source_index == 1 and str(len(big) + 1) in items[1].message
    assert peak < (1 << 20) / 2, peak  # the 1 MiB line was never read whole


def test_large_inputs_finish_fast(tmp_path, monkeypatch):
    """CI-sized versions of the big-file checks (figures for 100k rows / 300 MB in docs/reliability.md)."""
    import time

    monkeypatch.setattr(reader, "MAX_ROW_BYTES", 1 << 20)
    rows = generate_rows(2000, seed=0)
    array = tmp_path / "big.json"
    array.write_text(json.dumps(rows * 10)[:-1])  # 20,000 elements, no closing bracket
    start = time.perf_counter()
    count = 0
    with pytest.raises(reader.UnterminatedInput):
        for _ in iter_rows(array):
            count += 1
    assert count == 20_000
    line = tmp_path / "big.jsonl"
    with open(line, "w") as handle:
        handle.write('{"chosen": "')
        for _ in range(30):
            handle.write("x" * (1 << 20))
        handle.write('", "rejected": "b"}\n{"chosen": "a", "rejected": "b"}\n')
    assert [getattr(i, "reason", "ok") for i in iter_pairs(line)] == [R.OVERSIZE, "ok"]
    assert time.perf_counter() - start < 30


@pytest.mark.parametrize("name", ["rows.jsonl.gz", "rows.json.gz", "rows.bin"])
def test_gzip_files_read_as_their_uncompressed_rows(tmp_path, name):
    """`hh_harmless_base_test.jsonl.gz` as published: gzip is recognised by its bytes, not its name."""
    import gzip

    rows = generate_rows(12, seed=3)
    plain = write_jsonl(tmp_path / "rows.jsonl", rows)
    text = json.dumps(rows) if ".json." in name else plain.read_text()
    (tmp_path / name).write_bytes(gzip.compress(text.encode()))
    assert as_json(iter_pairs(tmp_path / name)) == as_json(iter_pairs(plain))


def test_gzip_parquet_is_refused_in_one_line(tmp_path):
    import gzip

    pq.write_table(pa.table({"chosen": ["a"], "rejected": ["b"]}), tmp_path / "x.parquet")
    (tmp_path / "x.parquet.gz").write_bytes(gzip.compress((tmp_path / "x.parquet").read_bytes()))
    with pytest.raises(UsageError, match="unpack it first"):
        list(iter_rows(tmp_path / "x.parquet.gz"))


def test_hub_folder_reads_gzip_shards(tmp_path):
    import gzip

    folder = tmp_path / "hub"
    (folder / "data").mkdir(parents=True)
    rows = generate_rows(6, seed=5)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (folder / "data" / "train-00000.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    assert len(list(iter_rows(folder))) == 6
