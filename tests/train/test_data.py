"""Training data preparation runs the data pipeline: same pairs, same rejection counts."""

from __future__ import annotations

import json

from rewardplane.data import reasons as R
from rewardplane.data.pipeline import Summary, tokenize_source
from rewardplane.data.synth import builtin_tokenizer, corrupt_rows, generate_rows
from rewardplane.data.tokenize import TokenizeSettings
from rewardplane.train.config import TrainConfig, from_dict
from rewardplane.train.data import prepare_data

LIMITS = {"max_length": 96, "max_completion_length": 96, "truncation": "truncate"}


def _write(path, rows) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_rejections_are_counted_as_rewardplane_data_validate_counts_them(tmp_path):
    path = tmp_path / "train.jsonl"
    _write(path, generate_rows(24, seed=5) + [row for _, row in corrupt_rows(1, seed=5)])
    data = prepare_data(from_dict(TrainConfig, {"data": {"train": str(path), **LIMITS}}))
    summary = Summary()
    expected = tokenize_source(path, builtin_tokenizer(), TokenizeSettings(**LIMITS), summary)
    assert data.rejected == summary.nonzero() == dict.fromkeys(sorted(R.REASONS), 1)
    assert data.train == expected and data.eval == [] and data.probe_sha256 is None


def test_the_synthetic_task_prepares_like_the_same_rows_in_files(tmp_path):
    synth = prepare_data(
        from_dict(TrainConfig, {"data": {"synth": {"train_rows": 20, "eval_rows": 6, "seed": 2}, **LIMITS}})
    )
    rows = generate_rows(26, seed=2)
    _write(tmp_path / "train.jsonl", rows[:20])
    _write(tmp_path / "eval.jsonl", rows[20:])
    files = {"train": str(tmp_path / "train.jsonl"), "eval": str(tmp_path / "eval.jsonl")}
    from_files = prepare_data(from_dict(TrainConfig, {"data": {**files, **LIMITS}}))
    assert (synth.train, synth.eval) == (from_files.train, from_files.eval)
    assert (synth.train_pairs_sha256, synth.probe_sha256) == (
        from_files.train_pairs_sha256,
        from_files.probe_sha256,
    )
    assert synth.rejected == from_files.rejected == {}
