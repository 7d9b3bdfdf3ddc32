"""pairs.jsonl / summary.json contents, the step-0 contract check, and reading artifacts back."""

from __future__ import annotations

import json
import math

import pytest

from rewardplane.core.errors import RewardplaneError, UsageError
from rewardplane.core.hashing import sha256_file
from rewardplane.eval.artifacts import (
    assert_same_contract,
    eval_step_dir,
    eval_steps,
    load_summary,
    read_pairs,
    write_eval_artifacts,
)

PROBE = "ab" * 32
PLAN = {"batch_size": 4, "order": "probe"}


def _write(out, **overrides):
    kwargs = dict(
        pair_ids=["p0", "p1", "p2", "p3"],
        chosen_scores=[2.0, 0.5, 1.0, 0.0],
        rejected_scores=[1.0, 0.5, 3.0, -1.0],
        subsets=["chat", "chat", "code", None],
        probe_sha256=PROBE,
        objective="reward_model",
        model_identity={"name": "tiny", "sha256": "00"},
        batch_plan=PLAN,
        replicates=500,
    )
    kwargs.update(overrides)
    return write_eval_artifacts(out, **kwargs)


def test_pairs_rows_by_hand(tmp_path):
    _write(tmp_path)
    rows = read_pairs(tmp_path / "pairs.jsonl")
    assert [r["pair_id"] for r in rows] == ["p0", "p1", "p2", "p3"]
    assert [r["margin"] for r in rows] == [1.0, 0.0, -2.0, 1.0]
    assert [r["correct"] for r in rows] == [True, False, False, True]
    assert [r["tie"] for r in rows] == [False, True, False, False]
    assert [r["subset"] for r in rows] == ["chat", "chat", "code", None]
    assert rows[0]["pair_loss"] == pytest.approx(math.log(1 + math.exp(-1)))
    assert rows[1]["pair_loss"] == pytest.approx(math.log(2))
    assert {r["probe_sha256"] for r in rows} == {PROBE}


def test_summary_by_hand(tmp_path):
    returned = _write(tmp_path)
    summary = load_summary(tmp_path)
    assert summary == returned
    assert summary["n_pairs"] == 4
    assert summary["accuracy"] == 0.5
    assert summary["tie_rate"] == 0.25
    assert summary["accuracy_tie_aware"] == pytest.approx((1 + 0.5 + 0 + 1) / 4)
    assert summary["margin_mean"] == 0.0
    assert summary["subsets"]["chat"]["n_pairs"] == 2 and summary["subsets"]["chat"]["accuracy"] == 0.5
    assert summary["subsets"]["code"]["accuracy"] == 0.0
    assert summary["n_without_subset"] == 1
    assert summary["pairs_sha256"] == sha256_file(tmp_path / "pairs.jsonl")
    assert (summary["probe_sha256"], summary["batch_plan"], summary["objective"]) == (
        PROBE,
        PLAN,
        "reward_model",
    )
    assert summary["bootstrap"]["strict"]["point"] == 0.5
    assert summary["bootstrap"]["tie_aware"]["point"] == pytest.approx(0.625)
    assert summary["bootstrap"]["strict"]["replicates"] == 500


def test_artifacts_are_byte_reproducible(tmp_path):
    _write(tmp_path / "a")
    _write(tmp_path / "b")
    for name in ("pairs.jsonl", "summary.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_explicit_pair_losses_are_written(tmp_path):
    _write(tmp_path, pair_losses=[0.1, 0.2, 0.3, 0.4])
    assert [r["pair_loss"] for r in read_pairs(tmp_path / "pairs.jsonl")] == [0.1, 0.2, 0.3, 0.4]
    assert load_summary(tmp_path)["loss_mean"] == pytest.approx(0.25)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"chosen_scores": [1.0, float("nan"), 0.0, 0.0]}, "NaN"),
        ({"pair_ids": ["p0", "p0", "p2", "p3"]}, "not unique"),
        ({"pair_ids": [0, 1, 2, 3]}, "must be strings"),
        ({"subsets": ["chat"]}, "one pair_id, subset"),
        ({"pair_losses": [0.1, float("inf"), 0.1, 0.1]}, "pair losses"),
    ],
)
def test_bad_scores_write_nothing(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        _write(tmp_path, **overrides)
    assert not (tmp_path / "pairs.jsonl").exists() and not (tmp_path / "summary.json").exists()


def test_same_contract_passes_and_refuses_with_the_difference(tmp_path):
    step0 = _write(eval_step_dir(tmp_path, 0))
    final = _write(eval_step_dir(tmp_path, 120), chosen_scores=[3.0, 1.0, 4.0, 1.0])
    assert_same_contract(step0, final)
    other_plan = _write(tmp_path / "x", batch_plan={"batch_size": 8, "order": "probe"})
    with pytest.raises(RewardplaneError, match="batch_plan") as info:
        assert_same_contract(step0, other_plan)
    assert info.value.code == "eval_contract_mismatch"
    other_probe = _write(tmp_path / "y", probe_sha256="cd" * 32)
    with pytest.raises(RewardplaneError, match="probe_sha256"):
        assert_same_contract(step0, other_probe)
    assert [step for step, _ in eval_steps(tmp_path)] == [0, 120]
    assert eval_step_dir(tmp_path, 120).name == "step-0000120"


def test_read_pairs_refuses_damaged_files(tmp_path):
    _write(tmp_path)
    lines = (tmp_path / "pairs.jsonl").read_text().splitlines()
    cases = {
        "not JSON": lines[:1] + ["{broken"],
        "duplicate pair_id": lines[:2] + lines[:1],
        "field 'correct'": [lines[0].replace('"correct": true', '"correct": 1')],
        "field 'margin'": [lines[0].replace('"margin": 1.0', '"margin": NaN')],
        "margin is not": [lines[0].replace('"margin": 1.0', '"margin": 1.5')],
        "correct/tie do not follow": [lines[0].replace('"correct": true', '"correct": false')],
        "probe_sha256 differs": lines[:1] + [lines[1].replace(PROBE, "cd" * 32)],
    }
    for reason, content in cases.items():
        path = tmp_path / "bad.jsonl"
        path.write_text("\n".join(content) + "\n")
        with pytest.raises(UsageError, match=reason):
            read_pairs(path)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(UsageError, match="no pairs"):
        read_pairs(tmp_path / "empty.jsonl")
    (tmp_path / "not-summary.json").write_text(json.dumps({"schema": "other"}))
    with pytest.raises(UsageError, match="not a rewardplane evaluation summary"):
        load_summary(tmp_path / "not-summary.json")
