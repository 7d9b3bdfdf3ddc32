"""The audit's statistics against scipy (a dev dependency; the package itself uses numpy only)
and by simulation where scipy has no counterpart (the jackknife interval's coverage)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rewardplane.eval.bootstrap import bootstrap_mean
from rewardplane.serve.audit.stats import Tau, kendall_tau, mean_interval, pool_taus, wilson, z_of

stats = pytest.importorskip("scipy.stats")


def _pairs(kind: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    x = rng.normal(size=n)
    y = 0.6 * x + rng.normal(size=n)
    if kind == "binary auditor":
        return x, (y > 0.3).astype(float)
    if kind == "ties in both":
        return np.round(x), np.round(y)
    return x, y


@pytest.mark.parametrize("kind", ["continuous", "binary auditor", "ties in both"])
@pytest.mark.parametrize("n", [5, 40, 300])
def test_tau_b_equals_scipys(kind, n):
    x, y = _pairs(kind, n, np.random.default_rng(n))
    assert kendall_tau(x, y).point == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-12)


def test_tau_is_undefined_for_a_constant_score_and_unusable_when_one_item_holds_it():
    x = np.arange(10.0)
    assert kendall_tau(x, np.ones(10)) is None
    assert kendall_tau(x[:2], x[:2]) is None
    one_off = np.ones(10)
    one_off[3] = 0.0  # a single item keeps the auditor from being constant
    tau = kendall_tau(x, one_off)
    assert tau is not None and math.isinf(tau.se)  # no interval: its jackknife would drop that item


@pytest.mark.parametrize(("rho", "n", "binary"), [(0.5, 80, False), (0.0, 50, False), (0.5, 120, True)])
def test_jackknife_interval_covers_the_true_tau(rho, n, binary):
    """The 95% interval covers τ about 95% of the time, and the one-sided upper bound at 0.05
    falls below τ about 5% of the time (what the alarms rely on)."""
    rng = np.random.default_rng(7)
    cov = [[1.0, rho], [rho, 1.0]]
    big = rng.multivariate_normal([0, 0], cov, size=20_000)
    truth = stats.kendalltau(big[:, 0], (big[:, 1] > 0.5) if binary else big[:, 1]).statistic
    covered = below = 0
    runs = 400
    for _ in range(runs):
        z = rng.multivariate_normal([0, 0], cov, size=n)
        tau = kendall_tau(z[:, 0], (z[:, 1] > 0.5).astype(float) if binary else z[:, 1])
        low, high = tau.interval()
        covered += low <= truth <= high
        below += tau.upper(0.05) < truth
    assert 0.91 <= covered / runs <= 0.98
    assert below / runs <= 0.09


def test_pooled_tau_weights_by_size_not_by_estimated_variance():
    a, b = Tau(0.5, 0.1, 100), Tau(-0.5, 0.001, 100)  # b's variance is (wrongly) tiny
    pooled = pool_taus([a, b, None, Tau(0.9, math.inf, 50)])
    assert pooled.point == pytest.approx(0.0) and pooled.n == 200
    assert pooled.se == pytest.approx(math.sqrt(100**2 * 0.1**2 + 100**2 * 0.001**2) / 200)
    assert pool_taus([None, Tau(0.2, math.inf, 9)]) is None


@pytest.mark.parametrize(("k", "n"), [(0, 50), (3, 120), (60, 100), (100, 100)])
def test_wilson_bounds_are_scipys_wilson_interval(k, n):
    alpha = 0.01
    low, high = wilson(k, n, alpha)
    # a one-sided bound at 1 - alpha is an end of the two-sided interval at 1 - 2·alpha
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=1 - 2 * alpha, method="wilson")
    assert (low, high) == (pytest.approx(ci.low, abs=1e-12), pytest.approx(ci.high, abs=1e-12))


def test_z_of_is_the_normal_quantile():
    assert z_of(0.05) == pytest.approx(stats.norm.ppf(0.95))


def test_mean_interval_is_the_evaluations_bootstrap():
    values = np.random.default_rng(3).normal(size=57)
    ours = mean_interval(values, seed=11, replicates=500)
    theirs = bootstrap_mean(values, statistic="x", seed=11, replicates=500)
    assert ours["mean"] == theirs["point"] and ours["ci_95"] == theirs["ci_95"]
    assert mean_interval(np.array([2.0, np.nan]), seed=0, replicates=100) == {
        "n": 1,
        "mean": 2.0,
        "ci_95": [2.0, 2.0],
    }
