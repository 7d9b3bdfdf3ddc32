"""The one read → normalise → validate → tokenise → count pipeline, as every consumer runs it."""

from __future__ import annotations

import json

import pytest

from rewardplane.core.errors import UsageError
from rewardplane.data import reasons as R
from rewardplane.data.pipeline import Summary, iter_validated, tokenize_source
from rewardplane.data.probe import freeze_probe, freeze_probe_file
from rewardplane.data.reasons import Rejection
from rewardplane.data.synth import builtin_tokenizer, corrupt_rows, generate_rows
from rewardplane.data.tokenize import TokenizeSettings

SETTINGS = TokenizeSettings(max_length=96, max_completion_length=96, truncation="truncate")


@pytest.fixture(scope="module")
def tok():
    return builtin_tokenizer()


def _rows() -> list:
    return generate_rows(20, seed=4) + [row for _, row in corrupt_rows(1, seed=4)]


def _write(path, rows) -> None:
    # corrupt rows hold NaN margins and a non-object row: plain json.dumps writes both
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_every_reason_is_counted_once_and_accepted_pairs_keep_input_order(tmp_path, tok):
    path = tmp_path / "rows.jsonl"
    _write(path, _rows())
    summary = Summary()
    pairs = tokenize_source(path, tok, SETTINGS, summary)
    assert summary.rows == 20 + 12 and summary.valid == len(pairs) == 21
    assert summary.rejections == dict.fromkeys(R.REASONS, 1)
    assert summary.nonzero() == dict.fromkeys(sorted(R.REASONS), 1)
    checked = [item for item in iter_validated(path, tok, SETTINGS) if not isinstance(item, Rejection)]
    assert [p.pair_id for p in pairs] == [tokenized.pair_id for _, tokenized in checked]


def test_decoded_rows_and_their_file_give_the_same_pairs_and_counts(tmp_path, tok):
    rows = [row for row in _rows() if isinstance(row, dict)]  # a file cannot hold a non-object row as-is
    path = tmp_path / "rows.jsonl"
    _write(path, rows)
    from_file, from_rows = Summary(), Summary()
    assert tokenize_source(path, tok, SETTINGS, from_file) == tokenize_source(rows, tok, SETTINGS, from_rows)
    assert from_file == from_rows and from_file.rejected > 0


def test_strict_raises_the_first_rejection_located(tok):
    rows = generate_rows(3, seed=1)
    with pytest.raises(Rejection) as caught:
        tokenize_source([*rows, rows[1]], tok, SETTINGS, strict=True)
    assert caught.value.reason == R.DUPLICATE_ID and caught.value.source_index == 3


def test_probe_freezing_reads_through_the_pipeline_and_refuses_dirty_files(tmp_path, tok):
    clean = tmp_path / "clean.jsonl"
    _write(clean, generate_rows(8, seed=2))
    expected = freeze_probe(tokenize_source(clean, tok, SETTINGS), tok, SETTINGS)
    assert freeze_probe_file(clean, tok, SETTINGS) == expected
    dirty = tmp_path / "dirty.jsonl"
    _write(dirty, _rows())
    with pytest.raises(UsageError, match=r"row 20 rejected \(schema: .*a probe is frozen from clean data"):
        freeze_probe_file(dirty, tok, SETTINGS)
