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

import functools
import hashlib
from collections.abc import Iterator, Sequence

import numpy as np

DEFAULT_SEED = 1234
DEFAULT_REPLICATES = 10_000
GENERATOR = "numpy.random.Generator(numpy.random.PCG64(seed))"
# Elements of the index array per chunk: 2^22 int64 indices (32 MiB) plus the gathered
# float64 values of the same shape keep the working set near 64 MiB for any n.
_CHUNK_ELEMENTS = 1 << 22
# Draws of at most 2^17 indices (1 MiB) are kept for reuse, the newest 8 of them.
_CACHED_ELEMENTS = 1 << 17
_CACHED_DRAWS = 8
# Gathered values per chunk of a kept draw: 2^13 float64 (64 KiB), below the size at which the
# C allocator maps (and the kernel zero-fills) fresh pages for every array.
_GATHER_ELEMENTS = 1 << 13


def as_statistic(values: Sequence[float] | np.ndarray, name: str = "values") -> np.ndarray:
    """A 1-D float64 array of finite per-pair statistics; anything else is refused."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name}: need a non-empty 1-D sequence, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name}: contains NaN or infinite values")
    return array


@functools.lru_cache(maxsize=_CACHED_DRAWS)
def _small_draw(seed: int, n: int, replicates: int) -> np.ndarray:
    """The whole index array of a small one-chunk draw, drawn once per (seed, n, replicates)
    and kept (read-only): the audit resamples every bin of the same size with one seed, so a
    fresh draw would repeat the same indices each time. The same array a fresh draw gives."""
    idx = np.random.Generator(np.random.PCG64(seed)).integers(0, n, size=(replicates, n))
    idx.flags.writeable = False
    return idx


def _index_chunks(
    seed: int, n: int, replicates: int, rows: int, gather_rows: int
) -> Iterator[tuple[int, int, np.ndarray]]:
    """(start, stop, indices) of each chunk of `rows` replicates, in order, from one stream; a
    small draw (kept) in chunks of `gather_rows`, so each gather's values stay small enough to
    reuse memory the process already has rather than map fresh pages for every bootstrap."""
    if rows >= replicates and replicates * n <= _CACHED_ELEMENTS:
        draw = _small_draw(seed, n, replicates)
        for start in range(0, replicates, gather_rows):
            stop = min(start + gather_rows, replicates)
            yield start, stop, draw[start:stop]
        return
    rng = np.random.Generator(np.random.PCG64(seed))
    for start in range(0, replicates, rows):
        stop = min(start + rows, replicates)
        yield start, stop, rng.integers(0, n, size=(stop - start, n))


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
    means = np.empty((*values.shape[:-1], replicates), dtype=np.float64)
    index_digest = hashlib.sha256()
    gather_rows = max(1, _GATHER_ELEMENTS // values.size)
    for start, stop, idx in _index_chunks(seed, n, replicates, rows, gather_rows):
        if index_sha256:
            index_digest.update(
                memoryview(np.ascontiguousarray(idx, dtype="<i8"))
            )  # no copy on little-endian hosts
        # `take`, not `values[..., idx]`: on 2-D values that gathers into a strided layout whose
        # means differ from the 1-D call's in the last bit, and is several times slower
        means[..., start:stop] = np.take(values, idx, axis=-1).mean(axis=-1, dtype=np.float64)
    return means, index_digest.hexdigest() if index_sha256 else ""
