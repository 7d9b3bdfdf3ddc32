"""The FP64 percentile bootstrap, specified exactly so anyone can recompute it.

    rng   = numpy.random.Generator(numpy.random.PCG64(seed))          # seed 1234
    idx   = rng.integers(0, n, size=(replicates, n))                  # int64, 10000 × n
    means = values[idx].mean(axis=1)                                  # float64
    lower_95 = numpy.percentile(means, 5)          # one-sided 95% lower bound
    ci_95    = numpy.percentile(means, [2.5, 97.5])
    point    = values.mean()

The index array is drawn in row chunks so 10,000 × 100,000 fits in bounded memory. Chunking
is exact, not approximate: `Generator.integers` with PCG64 continues one stream across calls
(the half-used 32-bit word is kept in the bit generator's state, not in the call), so the
concatenated chunks are the single-call array element for element, and the SHA-256 of the
index bytes is fed chunk by chunk over the same little-endian int64 bytes. Each replicate
mean reduces one row, so it does not depend on how many rows share a chunk. Both facts are
checked in tests/test_eval_bootstrap.py.

The paired version resamples the same indices for both models and bootstraps the per-pair
difference B − A, which is what makes "B is better than A" a defensible, paired statement.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

DEFAULT_SEED = 1234
DEFAULT_REPLICATES = 10_000
GENERATOR = "numpy.random.Generator(numpy.random.PCG64(seed))"
METHOD = "percentile"
METHOD_PAIRED = "paired percentile"
# Elements of the index array per chunk: 2^22 int64 indices (32 MiB) plus the gathered
# float64 values of the same shape keep the working set near 64 MiB for any n.
_CHUNK_ELEMENTS = 1 << 22


def as_statistic(values: Sequence[float] | np.ndarray, name: str = "values") -> np.ndarray:
    """A 1-D float64 array of finite per-pair statistics; anything else is refused."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name}: need a non-empty 1-D sequence, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name}: contains NaN or infinite values")
    return array


def default_chunk_rows(n: int) -> int:
    return max(1, _CHUNK_ELEMENTS // n)


def replicate_means(
    values: np.ndarray,
    *,
    seed: int = DEFAULT_SEED,
    replicates: int = DEFAULT_REPLICATES,
    chunk_rows: int | None = None,
) -> tuple[np.ndarray, str]:
    """Bootstrap replicate means of a 1-D float64 statistic, drawn `chunk_rows` replicates at a time.

    Returns the (replicates,) float64 means and the SHA-256 of the full index array as
    little-endian int64 bytes; both are identical for every `chunk_rows`.
    """
    n = values.size
    if replicates < 1:
        raise ValueError(f"replicates must be >= 1, got {replicates}")
    rows = chunk_rows if chunk_rows is not None else default_chunk_rows(n)
    if rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {rows}")
    rng = np.random.Generator(np.random.PCG64(seed))
    means = np.empty(replicates, dtype=np.float64)
    index_digest = hashlib.sha256()
    for start in range(0, replicates, rows):
        stop = min(start + rows, replicates)
        idx = rng.integers(0, n, size=(stop - start, n))
        index_digest.update(
            memoryview(np.ascontiguousarray(idx, dtype="<i8"))
        )  # no copy on little-endian hosts
        means[start:stop] = values[idx].mean(axis=1, dtype=np.float64)
    return means, index_digest.hexdigest()


def _means_sha256(means: np.ndarray) -> str:
    return hashlib.sha256(memoryview(np.ascontiguousarray(means, dtype="<f8"))).hexdigest()


def _interval_block(point: float, means: np.ndarray, threshold: float) -> dict[str, Any]:
    lower_95 = float(np.percentile(means, 5))
    low, high = np.percentile(means, [2.5, 97.5])
    return {
        "point": point,
        "lower_95": lower_95,
        "ci_95": [float(low), float(high)],
        "pass_threshold": threshold,
        "pass": bool(lower_95 > threshold),
    }


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
) -> dict[str, Any]:
    """The bootstrap block for the mean of a per-pair statistic (e.g. 1.0/0.0 correctness).

    `pass` means the one-sided 95% lower bound clears `threshold` (0.5: better than chance).
    `lower_95` is the 5th percentile — a one-sided bound, not the lower end of `ci_95`.
    """
    stat = as_statistic(values, statistic)
    means, index_sha256 = replicate_means(stat, seed=seed, replicates=replicates, chunk_rows=chunk_rows)
    block = _header(METHOD, statistic, seed, replicates, stat.size)
    block.update(_interval_block(float(stat.mean()), means, threshold))
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
    block.update(_interval_block(float(diff.mean()), means, 0.0))
    block["p_b_greater"] = float(np.mean(means > 0))
    block["index_sha256"] = index_sha256
    block["means_sha256"] = _means_sha256(means)
    return block
