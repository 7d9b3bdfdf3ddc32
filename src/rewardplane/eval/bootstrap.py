"""The FP64 percentile bootstrap, specified exactly so anyone can recompute it.

    rng   = numpy.random.Generator(numpy.random.PCG64(seed))          # seed 1234
    idx   = rng.integers(0, n, size=(replicates, n))                  # int64, 10000 × n
    means = values[idx].mean(axis=1)                                  # float64
    lower_95 = numpy.percentile(means, 5)          # one-sided 95% lower bound
    ci_95    = numpy.percentile(means, [2.5, 97.5])
    point    = values.mean()

The index array is drawn in row chunks, exactly (the chunked draw is the single-call array
element for element): `core/resample.py`, which the audit stream's statistics share.

An interval never leaves the statistic's range: the percentile interval of a plain mean lies
within its values by construction, but a weighted score written as the mean of rescaled values
(eval/benchmarks/common.py) can draw replicates beyond it on a few rows, so its callers pass
`bounds` (the range the statistic can take) and `ci_95` / `lower_95` are clipped to it
(`clipped` in the block says whether that happened).

The paired version resamples the same indices for both models and bootstraps the per-pair
difference B − A, which is what makes "B is better than A" a defensible, paired statement.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from rewardplane.core.resample import (
    DEFAULT_REPLICATES,
    DEFAULT_SEED,
    GENERATOR,
    as_statistic,
    replicate_means,
)

METHOD = "percentile"
METHOD_PAIRED = "paired percentile"


def _means_sha256(means: np.ndarray) -> str:
    return hashlib.sha256(memoryview(np.ascontiguousarray(means, dtype="<f8"))).hexdigest()


def _interval_block(
    point: float, means: np.ndarray, threshold: float, bounds: tuple[float, float] | None = None
) -> dict[str, Any]:
    raw = [float(np.percentile(means, 5)), *(float(v) for v in np.percentile(means, [2.5, 97.5]))]
    lower_95, low, high = (min(max(v, bounds[0]), bounds[1]) for v in raw) if bounds else raw
    block = {
        "point": point,
        "lower_95": lower_95,
        "ci_95": [low, high],
        "pass_threshold": threshold,
        "pass": bool(lower_95 > threshold),
    }
    if bounds is not None:
        block["bounds"] = list(bounds)
        block["clipped"] = [lower_95, low, high] != raw
    return block


def _header(method: str, statistic: str, seed: int, replicates: int, n: int) -> dict[str, Any]:
    return {
        "method": method,
        "statistic": statistic,
        "seed": seed,
        "generator": GENERATOR,
        "replicates": replicates,
        "n": n,
        "numpy_version": np.__version__,
    }


def bootstrap_mean(
    values: Sequence[float] | np.ndarray,
    *,
    statistic: str,
    seed: int = DEFAULT_SEED,
    replicates: int = DEFAULT_REPLICATES,
    threshold: float = 0.5,
    chunk_rows: int | None = None,
    bounds: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """The bootstrap block for the mean of a per-pair statistic (e.g. 1.0/0.0 correctness).

    `pass` means the one-sided 95% lower bound clears `threshold` (0.5: better than chance).
    `lower_95` is the 5th percentile — a one-sided bound, not the lower end of `ci_95`.
    `bounds`: the statistic's range, which the interval is clipped to.
    """
    stat = as_statistic(values, statistic)
    means, index_sha256 = replicate_means(stat, seed=seed, replicates=replicates, chunk_rows=chunk_rows)
    block = _header(METHOD, statistic, seed, replicates, stat.size)
    block.update(_interval_block(float(stat.mean()), means, threshold, bounds))
    block["index_sha256"] = index_sha256
    block["means_sha256"] = _means_sha256(means)
    return block


def paired_bootstrap(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    *,
    statistic: str,
    seed: int = DEFAULT_SEED,
    replicates: int = DEFAULT_REPLICATES,
    chunk_rows: int | None = None,
    bounds: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """Paired bootstrap of mean(b) − mean(a): every replicate resamples the same pairs for both.

    The replicated statistic is the per-pair difference b − a, so `means_sha256` covers the
    difference means. `p_b_greater` is the share of replicates where B's mean beats A's;
    `pass` means the one-sided 95% lower bound of the difference is above 0.
    """
    stat_a = as_statistic(a, "a")
    stat_b = as_statistic(b, "b")
    if stat_a.shape != stat_b.shape:
        raise ValueError(f"paired bootstrap needs equal lengths, got {stat_a.size} and {stat_b.size}")
    diff = stat_b - stat_a
    means, index_sha256 = replicate_means(diff, seed=seed, replicates=replicates, chunk_rows=chunk_rows)
    block = _header(METHOD_PAIRED, f"{statistic} difference (B - A)", seed, replicates, diff.size)
    block.update(_interval_block(float(diff.mean()), means, 0.0, bounds))
    block["p_b_greater"] = float(np.mean(means > 0))
    block["index_sha256"] = index_sha256
    block["means_sha256"] = _means_sha256(means)
    return block
