"""Every per-pair metric against numbers worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rewardplane.eval import metrics

# margins: +2, 0 (exact tie), +5e-7 (tie, strictly positive), -1, -3e-7 (tie, negative), +1e-5 (not a tie)
CHOSEN = [3.0, 1.0, 0.0000005, 0.0, -0.0000003, 0.00001]
REJECTED = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0]


def test_margins_correct_ties_and_tie_aware_credit():
    margin = metrics.margins(CHOSEN, REJECTED)
    np.testing.assert_allclose(margin, [2.0, 0.0, 5e-7, -1.0, -3e-7, 1e-5])
    assert metrics.strict_correct(margin).tolist() == [True, False, True, False, False, True]
    assert metrics.ties(margin).tolist() == [False, True, True, False, True, False]
    assert metrics.tie_aware_credit(margin).tolist() == [1.0, 0.5, 0.5, 0.0, 0.5, 1.0]


def test_bradley_terry_loss_by_hand():
    loss = metrics.bradley_terry_loss(np.array([0.0, 2.0, -1.0, 800.0, -800.0]))
    assert loss[0] == pytest.approx(math.log(2))
    assert loss[1] == pytest.approx(math.log(1 + math.exp(-2)))
    assert loss[2] == pytest.approx(math.log(1 + math.e))
    assert loss[3] == pytest.approx(0.0, abs=1e-300)
    assert loss[4] == pytest.approx(800.0)  # no overflow for large negative margins


def test_summarize_by_hand():
    margin = metrics.margins(CHOSEN, REJECTED)
    loss = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    summary = metrics.summarize(margin, loss)
    assert summary["n_pairs"] == 6
    assert summary["accuracy"] == pytest.approx(3 / 6)
    assert summary["tie_rate"] == pytest.approx(3 / 6)
    assert summary["accuracy_tie_aware"] == pytest.approx((1 + 0.5 + 0.5 + 0 + 0.5 + 1) / 6)
    assert summary["margin_mean"] == pytest.approx((2 + 0 + 5e-7 - 1 - 3e-7 + 1e-5) / 6)
    assert summary["loss_mean"] == pytest.approx(3.5)


def test_per_subset_by_hand():
    margin = np.array([1.0, -1.0, 2.0, 0.0, 3.0])
    loss = np.zeros(5)
    table = metrics.per_subset(margin, loss, ["chat", "code", "chat", "code", None])
    assert list(table) == ["chat", "code"]
    assert (table["chat"]["n_pairs"], table["chat"]["accuracy"]) == (2, 1.0)
    assert (table["code"]["n_pairs"], table["code"]["accuracy"], table["code"]["accuracy_tie_aware"]) == (
        2,
        0.0,
        0.25,
    )


def test_non_finite_or_mismatched_scores_are_refused():
    with pytest.raises(ValueError, match="1 NaN/infinite value.*position 1"):
        metrics.margins([1.0, float("nan")], [0.0, 0.0])
    with pytest.raises(ValueError, match="rejected scores"):
        metrics.margins([1.0], [float("inf")])
    with pytest.raises(ValueError, match="2 chosen scores but 1"):
        metrics.margins([1.0, 2.0], [0.0])
