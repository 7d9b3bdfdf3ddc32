"""The resampling core of the FP64 percentile bootstrap: seeded index draws and replicate means.

Both the evaluation's bootstrap (`eval/bootstrap.py`, which specifies the method in full) and the
audit stream's statistics (`serve/audit/stats.py`) resample through this one function, so the
serving side needs nothing of `eval`.

The index array is drawn in row chunks so 10,000 × 100,000 fits in bounded memory. Chunking
is exact, not approximate: `Generator.integers` with PCG64 continues one stream across calls
(the half-used 32-bit word is kept in the bit generator's state, not in the call), so the
concatenated chunks are the single-call array element for element, and the SHA-256 of the
index bytes is fed chunk by chunk over the same little-endian int64 bytes. Each replicate
mean reduces one row, so it does not depend on how many rows share a chunk. Both facts are
checked in tests/eval/test_bootstrap.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

DEFAULT_SEED = 1234
DEFAULT_REPLICATES = 10_000
GENERATOR = "numpy.random.Generator(numpy.random.PCG64(seed))"
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
    index_sha256: bool = True,
) -> tuple[np.ndarray, str]:
    """Bootstrap replicate means of a 1-D float64 statistic, drawn `chunk_rows` replicates at a time.

    Returns the (replicates,) float64 means and the SHA-256 of the full index array as
    little-endian int64 bytes; both are identical for every `chunk_rows`. A 2-D `values` of
    shape (k, n) is k columns resampled with the one index draw (the same rows of items for
    every column): (k, replicates) means, each row what the 1-D call on that column gives.
    `index_sha256=False` skips the digest ("" is returned) where no one records it.
    """
    n = values.shape[-1]
    if replicates < 1:
        raise ValueError(f"replicates must be >= 1, got {replicates}")
    rows = chunk_rows if chunk_rows is not None else max(1, default_chunk_rows(n) // max(1, values.size // n))
    if rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {rows}")
    rng = np.random.Generator(np.random.PCG64(seed))
    means = np.empty((*values.shape[:-1], replicates), dtype=np.float64)
    index_digest = hashlib.sha256()
    for start in range(0, replicates, rows):
        stop = min(start + rows, replicates)
        idx = rng.integers(0, n, size=(stop - start, n))
        if index_sha256:
            index_digest.update(
                memoryview(np.ascontiguousarray(idx, dtype="<i8"))
            )  # no copy on little-endian hosts
        # `take`, not `values[..., idx]`: on 2-D values that gathers into a strided layout whose
        # means differ from the 1-D call's in the last bit, and is several times slower
        means[..., start:stop] = np.take(values, idx, axis=-1).mean(axis=-1, dtype=np.float64)
    return means, index_digest.hexdigest() if index_sha256 else ""
