"""`rewardplane compare`: exact McNemar, paired differences, and refusals of incomparable files."""

from __future__ import annotations

import json
from math import comb

import numpy as np
import pytest
from scipy import stats

from rewardplane.cli import main
from rewardplane.core.errors import UsageError
from rewardplane.eval.artifacts import write_eval_artifacts
from rewardplane.eval.compare import compare_pairs, mcnemar_exact

PROBE = "ab" * 32


def test_mcnemar_hand_computed():
    # 1 vs 5 discordant: 2 * (C(6,0) + C(6,1)) / 2^6 = 2 * 7 / 64
    assert mcnemar_exact(1, 5) == 14 / 64
    assert mcnemar_exact(5, 1) == 14 / 64
    # 0 vs 4: 2 / 16
    assert mcnemar_exact(0, 4) == 0.125
    # 2 vs 8: 2 * (1 + 10 + 45) / 1024
    assert mcnemar_exact(2, 8) == 112 / 1024
    assert mcnemar_exact(3, 3) == 1.0  # capped
    assert mcnemar_exact(0, 0) == 1.0


def test_mcnemar_matches_binomial_test_for_large_counts():
    for a_only, b_only in ((40, 61), (500, 560), (3, 90)):
        expected = stats.binomtest(a_only, a_only + b_only, 0.5).pvalue
        assert mcnemar_exact(a_only, b_only) == pytest.approx(expected, rel=1e-12)
    n = 12
    assert mcnemar_exact(4, 8) == 2 * sum(comb(n, k) for k in range(5)) / 2**n


def _evaluation(directory, correct, *, probe=PROBE, ids=None, subsets=None):
    n = len(correct)
    return write_eval_artifacts(
        directory,
        pair_ids=ids or [f"p{i}" for i in range(n)],
        chosen_scores=[1.0 if c else -1.0 for c in correct],
        rejected_scores=[0.0] * n,
        subsets=subsets or ["chat" if i % 2 == 0 else "code" for i in range(n)],
        probe_sha256=probe,
        objective="reward_model",
        model_identity={"name": str(directory)},
        batch_plan={"batch_size": 2},
        replicates=200,
    )


def test_differences_discordant_counts_and_paired_bootstrap(tmp_path):
    a = [True, True, False, False, True, False, True, False]
    b = [True, False, True, True, True, True, True, False]
    _evaluation(tmp_path / "a", a)
    _evaluation(tmp_path / "b", b)
    result = compare_pairs(tmp_path / "a" / "pairs.jsonl", tmp_path / "b" / "pairs.jsonl", replicates=500)
    assert (result["accuracy_a"], result["accuracy_b"], result["difference"]) == (0.5, 0.75, 0.25)
    # A-only: pair 1; B-only: pairs 2, 3, 5 → p = 2 * (1 + 4) / 16
    assert (result["discordant_a_only"], result["discordant_b_only"]) == (1, 3)
    assert result["mcnemar_p"] == 10 / 16
    block = result["bootstrap"]["strict"]
    idx = np.random.Generator(np.random.PCG64(1234)).integers(0, 8, size=(500, 8))
    diff = np.array(b, dtype=float) - np.array(a, dtype=float)
    means = diff[idx].mean(axis=1)
    assert block["ci_95"] == list(np.percentile(means, [2.5, 97.5]))
    assert block["p_b_greater"] == np.mean(means > 0)
    chat, code = result["subsets"]["chat"], result["subsets"]["code"]  # even / odd positions
    assert (chat["accuracy_a"], chat["accuracy_b"], chat["discordant_b_only"]) == (0.75, 1.0, 1)
    assert (code["accuracy_a"], code["accuracy_b"], code["discordant_a_only"]) == (0.25, 0.5, 1)


def test_b_rows_are_aligned_to_a_by_pair_id(tmp_path):
    _evaluation(tmp_path / "a", [True, False, False], ids=["x", "y", "z"], subsets=["s", "s", "s"])
    _evaluation(tmp_path / "b", [True, False, True], ids=["z", "y", "x"], subsets=["s", "s", "s"])
    result = compare_pairs(tmp_path / "a" / "pairs.jsonl", tmp_path / "b" / "pairs.jsonl", replicates=50)
    # B is right on z and x; against A (right on x only) B gains z and loses nothing
    assert (result["discordant_a_only"], result["discordant_b_only"]) == (0, 1)


@pytest.mark.parametrize(
    ("b_kwargs", "code", "message"),
    [
        ({"probe": "cd" * 32}, "probe_mismatch", "different probes"),
        ({"ids": ["p0", "p1", "q2", "p3"]}, "pair_ids_mismatch", "1 only in"),
        ({"subsets": ["chat", "chat", "chat", "code"]}, "subset_mismatch", "pair 'p2'"),
    ],
)
def test_refuses_incomparable_evaluations(tmp_path, b_kwargs, code, message):
    _evaluation(tmp_path / "a", [True, False, True, False], subsets=["chat", "chat", "code", "code"])
    _evaluation(
        tmp_path / "b", [True, True, True, False], **{"subsets": ["chat", "chat", "code", "code"], **b_kwargs}
    )
    with pytest.raises(UsageError, match=message) as info:
        compare_pairs(tmp_path / "a" / "pairs.jsonl", tmp_path / "b" / "pairs.jsonl")
    assert info.value.code == code


def test_cli_writes_comparison_and_prints_table(tmp_path, capsys):
    _evaluation(tmp_path / "a", [True, False] * 10)
    _evaluation(tmp_path / "b", [True, True] * 10)
    code = main(
        [
            "compare",
            str(tmp_path / "a/pairs.jsonl"),
            str(tmp_path / "b/pairs.jsonl"),
            "--out",
            str(tmp_path / "c"),
        ]
        + ["--replicates", "300"]
    )
    assert code == 0
    comparison = json.loads((tmp_path / "c" / "comparison.json").read_text())
    assert comparison["difference"] == 0.5 and comparison["discordant_b_only"] == 10
    assert comparison["bootstrap"]["strict"]["replicates"] == 300
    out = capsys.readouterr().out
    assert "McNemar p" in out and "(all)" in out and "code" in out


def test_cli_refusal_is_one_line_exit_2(tmp_path, capsys):
    _evaluation(tmp_path / "a", [True, False])
    _evaluation(tmp_path / "b", [True, True], probe="cd" * 32)
    code = main(
        [
            "compare",
            str(tmp_path / "a/pairs.jsonl"),
            str(tmp_path / "b/pairs.jsonl"),
            "--out",
            str(tmp_path / "c"),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "different probes" in err
    assert not (tmp_path / "comparison.json").exists()
