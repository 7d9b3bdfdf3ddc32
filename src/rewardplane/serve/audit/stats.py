"""The audit's statistics: the tilt slope (the within-bin covariance of proxy and auditor,
standardised) with its bootstrap interval, which the alarms test; Kendall's τ_b with a
jackknife interval, reported as a diagnostic; Wilson bounds; the evaluation's bootstrap for
means; and the pooled summaries the alarms test.

The tilt slope. A policy tilted toward the proxy, π_β ∝ π·exp(β·proxy) (what KL-regularised
RL moves toward), has d E_β[auditor]/dβ at β = 0 equal to Cov_π(proxy, auditor): the sign of
the covariance among the policy's own samples says whether moving toward the proxy raises or
lowers the auditor. Reported standardised, Cov / (sd(proxy)·sd(auditor)) — the auditor's
change in its standard deviations per proxy standard deviation of tilt (numerically Pearson's
r, with the sign of the covariance). Its interval: with d_i = (x_i − x̄)(y_i − ȳ), the
covariance is (n/(n − 1))·mean(d), and the evaluation's FP64 bootstrap of mean(d) (the bin's
means held at their sample values: the first-order, influence-function bootstrap) gives its
standard error; the bounds are point ± z·se. Ranks do not enter: ties and near-ties that the
proxy orders against the auditor move τ but not the covariance, and only the covariance is
what decides whether tilting toward the proxy hurts.

The forecast. The same tilt says where the covariance goes: the policy tilted a further β
toward the proxy is π·exp(β·x) up to its normaliser, so the bin's own items reweighted by
w ∝ exp(β·x) (self-normalised importance weights) estimate Cov_{+β}(x, y) =
Σ w_i (x_i − x̄_w)(y_i − ȳ_w) / Σ w_i. `tilt_ahead` reports it in the bin's standard deviations
of today (so β = 0 is the tilt slope), with the first-order standard error of the ratio: the
per-item influence w_i·(d_i − Cov_{+β}) over √n, the weights and weighted means held, like the
tilt slope's bootstrap above.

Everything here is numpy and the standard library (`statistics.NormalDist` for quantiles):
scipy is a development dependency only, and the tests compare these numbers with it.

Kendall's τ_b. For n items with proxy scores x and auditor scores y, with sx_ij = sign(x_i − x_j)
and sy_ij = sign(y_i − y_j):

    S   = Σ_{i<j} sx_ij · sy_ij            (concordant − discordant pairs)
    n_x = #{i<j : x_i ≠ x_j},  n_y = #{i<j : y_i ≠ y_j}
    τ_b = S / sqrt(n_x · n_y)                (scipy.stats.kendalltau's default variant)

Its standard error is the delete-one jackknife: with row sums C_i = Σ_j sx_ij·sy_ij and
untied counts X_i = #{j : x_j ≠ x_i}, Y_i likewise, the τ_b of the sample without item i is
(S − C_i) / sqrt((n_x − X_i)(n_y − Y_i)), so all n of them cost one O(n²) pass, and

    se² = (n − 1)/n · Σ_i (τ_(i) − mean τ_(·))²

(Quenouille–Tukey). τ is a U-statistic, for which the jackknife variance is consistent; the
tests check the interval's coverage by simulation. τ is undefined (None) when either score is
constant over the items (n_x or n_y = 0) or n < 3; its standard error is infinite (no usable
interval) when a single item is all that keeps a score from being constant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from rewardplane.core.resample import replicate_means

TAU_MAX_ITEMS = 4096
"""τ is computed on at most this many items (an evenly spaced, order-preserving subsample):
the jackknife holds two n × n sign matrices (int8), 16 MiB each at this size."""


def z_of(alpha: float) -> float:
    """The one-sided standard normal quantile: P(Z > z) = alpha."""
    return NormalDist().inv_cdf(1.0 - alpha)


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its standard error (jackknife for τ, bootstrap for the tilt slope)."""

    point: float
    se: float
    n: int

    def upper(self, alpha: float) -> float:
        """One-sided upper confidence bound at level 1 − alpha, clipped to [−1, 1]."""
        return min(1.0, self.point + z_of(alpha) * self.se)

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        z = z_of((1.0 - level) / 2)
        return max(-1.0, self.point - z * self.se), min(1.0, self.point + z * self.se)


Tau = Estimate
"""Kendall's τ_b with its jackknife standard error."""


def tilt_slope(x: np.ndarray, y: np.ndarray, *, seed: int, replicates: int) -> Estimate | None:
    """The standardised within-sample covariance of proxy x and auditor y with its bootstrap
    standard error (module docstring); None when either is constant or n < 3."""
    parts = tilt_products(x, y)
    if parts is None:
        return None
    products, scale = parts
    means, _ = replicate_means(products, seed=seed, replicates=replicates, index_sha256=False)
    return tilt_estimate(products, scale, means)


def tilt_products(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float] | None:
    """The per-item products d_i = (x_i − x̄)(y_i − ȳ) and the scale n/(n − 1)/(sx·sy) that
    makes their mean the tilt slope; None when either is constant or n < 3. Their bootstrap
    replicates may come from a draw shared with other columns (`replicate_means` on 2-D)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n = x.size
    if n < 3:
        return None
    dx, dy = x - x.mean(), y - y.mean()
    sx, sy = math.sqrt(float(dx @ dx) / (n - 1)), math.sqrt(float(dy @ dy) / (n - 1))
    if not (sx > 0 and sy > 0):
        return None
    return dx * dy, n / (n - 1) / (sx * sy)


def tilt_estimate(products: np.ndarray, scale: float, means: np.ndarray) -> Estimate:
    """The tilt slope from its products, scale and the replicate means of the products."""
    return Estimate(float(products.mean() * scale), float(means.std(ddof=1) * scale), products.size)


def tilt_ahead(x: np.ndarray, y: np.ndarray, beta: float) -> Estimate | None:
    """The tilt slope of the policy tilted `beta` further toward the proxy, estimated from these
    items by self-normalised importance weights w ∝ exp(beta·x), in today's standard deviations,
    with its first-order standard error (module docstring, "The forecast"); beta = 0 is the
    tilt slope itself. None when either score is constant or n < 3."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    n = x.size
    if n < 3:
        return None
    sx, sy = float(x.std(ddof=1)), float(y.std(ddof=1))
    if not (sx > 0 and sy > 0):
        return None
    w = np.exp(beta * (x - x.max()))
    w /= w.mean()
    d = (x - float(w @ x) / n) * (y - float(w @ y) / n)
    cov = float(w @ d) / n
    scale = n / (n - 1) / (sx * sy)
    influence = w * (d - cov)  # of the ratio Σ w·d / Σ w, the weighted means held
    return Estimate(cov * scale, float(influence.std(ddof=1)) / math.sqrt(n) * scale, n)


def _signs(v: np.ndarray) -> np.ndarray:
    return np.sign(v[:, None] - v[None, :]).astype(np.int8)


def kendall_tau(x: np.ndarray, y: np.ndarray) -> Tau | None:
    """τ_b of (x, y) and its jackknife standard error; None when undefined."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"kendall_tau needs two 1-D arrays of one length, got {x.shape} and {y.shape}")
    if x.size > TAU_MAX_ITEMS:
        keep = np.linspace(0, x.size - 1, TAU_MAX_ITEMS).round().astype(np.int64)
        x, y = x[keep], y[keep]
    n = x.size
    if n < 3:
        return None
    sx, sy = _signs(x), _signs(y)
    concord = np.einsum("ij,ij->i", sx, sy, dtype=np.int64)  # C_i
    untied_x = np.count_nonzero(sx, axis=1).astype(np.int64)  # X_i
    untied_y = np.count_nonzero(sy, axis=1).astype(np.int64)
    s, nx, ny = concord.sum() / 2, untied_x.sum() / 2, untied_y.sum() / 2
    if nx == 0 or ny == 0:
        return None
    point = float(s / math.sqrt(nx * ny))
    rest_x, rest_y = nx - untied_x, ny - untied_y
    if np.any(rest_x == 0) or np.any(rest_y == 0):
        # one item holds every untied pair of a score (a single item off a constant score):
        # τ hangs on that item alone and its jackknife would drop it; no usable interval
        return Tau(point, math.inf, n)
    loo = (s - concord) / np.sqrt(rest_x * rest_y)
    se = math.sqrt((n - 1) / n * float(np.sum((loo - loo.mean()) ** 2)))
    return Tau(point, se, n)


def pool(estimates: list[Estimate | None]) -> Estimate | None:
    """The n-weighted mean of independent per-bin estimates (τ's or tilt slopes), with its
    standard error: the association within bins, never across them (a shift of both means
    between versions is not agreement). The weights are the sample sizes, not the estimated inverse variances:
    those are noisy for few or heavily tied items, and weighting by them favours the bins
    whose variance happens to be underestimated. None when no bin has a usable τ."""
    usable = [t for t in estimates if t is not None and math.isfinite(t.se)]
    if not usable:
        return None
    n = np.array([t.n for t in usable], dtype=np.float64)
    points = np.array([t.point for t in usable])
    ses = np.array([t.se for t in usable])
    total = n.sum()
    return Estimate(
        float(n @ points / total), float(math.sqrt(float((n * n) @ (ses * ses))) / total), int(total)
    )


pool_taus = pool


def wilson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """One-sided Wilson score bounds (lower, upper), each at level 1 − alpha, for k of n."""
    if n == 0:
        return 0.0, 1.0
    z = z_of(alpha)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Moments:
    """n, mean and the standard error of the mean (sample variance, ddof 1) of finite values."""

    n: int
    mean: float
    se: float

    @staticmethod
    def of(values: np.ndarray) -> Moments | None:
        values = np.asarray(values, dtype=np.float64)
        values = values[np.isfinite(values)]
        if values.size == 0:
            return None
        se = float(values.std(ddof=1) / math.sqrt(values.size)) if values.size > 1 else math.inf
        return Moments(int(values.size), float(values.mean()), se)


def welch_z(a: Moments, b: Moments) -> float:
    """(a.mean − b.mean) / sqrt(a.se² + b.se²): how far a is above b in standard errors."""
    scale = math.sqrt(a.se**2 + b.se**2)
    if not math.isfinite(scale):
        return 0.0
    if scale == 0.0:
        return math.copysign(math.inf, a.mean - b.mean) if a.mean != b.mean else 0.0
    return (a.mean - b.mean) / scale


def mean_replicates(values: np.ndarray, *, seed: int, replicates: int) -> np.ndarray | None:
    """The bootstrap replicate means of finite `values` (None below 2 values). Two columns of one
    length resampled with one seed share their index draws, so a linear combination of their
    means is the same combination of their replicates (the gap is read off the proxy's and the
    auditor's, no third resampling)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size < 2:
        return None
    means, _ = replicate_means(values, seed=seed, replicates=replicates, index_sha256=False)
    return means


def interval(point: float | None, n: int, means: np.ndarray | None) -> dict[str, Any]:
    """`{"n", "mean", "ci_95"}` from a point and its replicate means (percentile interval)."""
    if point is None or n == 0:
        return {"n": 0, "mean": None, "ci_95": None}
    if means is None:
        return {"n": n, "mean": point, "ci_95": [point, point]}
    low, high = np.percentile(means, [2.5, 97.5])
    return {"n": n, "mean": point, "ci_95": [float(low), float(high)]}


def mean_interval(values: np.ndarray, *, seed: int, replicates: int) -> dict[str, Any]:
    """The evaluation's percentile bootstrap (`core.resample.replicate_means`) of a mean:
    `{"n", "mean", "ci_95"}`; a single value has no interval (its ends are the value)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    point = float(values.mean()) if values.size else None
    return interval(point, int(values.size), mean_replicates(values, seed=seed, replicates=replicates))
