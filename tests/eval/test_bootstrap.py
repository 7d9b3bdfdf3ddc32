"""The bootstrap equals the issue's formula exactly, chunked or not, and agrees with scipy."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from scipy import stats

from rewardplane.core import resample
from rewardplane.core.resample import replicate_means
from rewardplane.eval.bootstrap import bootstrap_mean, paired_bootstrap


def _spec(values: np.ndarray, seed: int, replicates: int) -> tuple[np.ndarray, np.ndarray]:
    """The issue's single-call definition, written out literally."""
    rng = np.random.Generator(np.random.PCG64(seed))
    idx = rng.integers(0, values.size, size=(replicates, values.size))
    return idx, values[idx].mean(axis=1)


def _accuracy_values(n: int, p: float, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).random(n) < p).astype(np.float64)


def test_block_matches_the_single_call_formula():
    values = _accuracy_values(97, 0.7)
    idx, means = _spec(values, 1234, 2000)
    block = bootstrap_mean(values, statistic="accuracy", replicates=2000)
    assert block["point"] == values.mean()
    assert block["lower_95"] == np.percentile(means, 5)
    assert block["ci_95"] == list(np.percentile(means, [2.5, 97.5]))
    assert block["index_sha256"] == hashlib.sha256(idx.astype("<i8").tobytes()).hexdigest()
    assert block["means_sha256"] == hashlib.sha256(means.astype("<f8").tobytes()).hexdigest()
    assert block["pass"] is bool(block["lower_95"] > 0.5)
    assert (block["seed"], block["replicates"], block["n"], block["numpy_version"]) == (
        1234,
        2000,
        97,
        np.__version__,
    )


def test_percentile_is_linear_interpolation_of_sorted_means():
    values = _accuracy_values(50, 0.6)
    _, means = _spec(values, 1234, 10_000)
    ordered = np.sort(means)
    # numpy's default percentile: position q/100 * (R - 1), linear between neighbours
    expected_lower = ordered[499] + 0.95 * (ordered[500] - ordered[499])
    expected_high = ordered[9748] + 0.75 * (ordered[9749] - ordered[9748])
    block = bootstrap_mean(values, statistic="accuracy")
    assert block["lower_95"] == pytest.approx(expected_lower, abs=1e-15)
    assert block["ci_95"][1] == pytest.approx(expected_high, abs=1e-15)


def test_hand_computed_degenerate_cases():
    always = bootstrap_mean([1.0, 1.0, 1.0], statistic="accuracy", replicates=50)
    assert (always["point"], always["lower_95"], always["ci_95"], always["pass"]) == (
        1.0,
        1.0,
        [1.0, 1.0],
        True,
    )
    chance = bootstrap_mean([0.5] * 4, statistic="tie-aware", replicates=50)
    assert (chance["lower_95"], chance["pass"]) == (0.5, False)  # lower bound must be strictly above 0.5
    single = bootstrap_mean([0.0], statistic="accuracy", replicates=10)
    assert single["ci_95"] == [0.0, 0.0]


def test_bit_for_bit_reproducible_and_seed_sensitive():
    values = _accuracy_values(300, 0.55)
    first = bootstrap_mean(values, statistic="accuracy", replicates=3000)
    again = bootstrap_mean(values.copy(), statistic="accuracy", replicates=3000)
    other_seed = bootstrap_mean(values, statistic="accuracy", replicates=3000, seed=1235)
    assert first == again
    assert other_seed["index_sha256"] != first["index_sha256"]


def test_generator_stream_continues_across_row_chunks():
    """The premise of exact chunking: chunked integers() calls concatenate to the one-call array.

    Odd row lengths make a call end half-way through a 64-bit word; PCG64 keeps that half
    in its state, so the next call continues from it.
    """
    for n in (1, 3, 7, 512, 100_003):
        width = min(n, 11)
        whole = np.random.Generator(np.random.PCG64(1234)).integers(0, n, size=(41, width))
        rng = np.random.Generator(np.random.PCG64(1234))
        parts = [rng.integers(0, n, size=(rows, width)) for rows in (1, 2, 3, 5, 7, 23)]
        assert np.array_equal(np.concatenate(parts), whole), n


@pytest.mark.parametrize("values", [_accuracy_values(37, 0.6), np.random.default_rng(3).normal(size=129)])
def test_chunked_equals_single_call_exactly(values):
    single, single_hash = replicate_means(values, replicates=1001, chunk_rows=1001)
    for rows in (1, 7, 64, 1000, 5000):
        chunked, chunked_hash = replicate_means(values, replicates=1001, chunk_rows=rows)
        assert chunked.tobytes() == single.tobytes()
        assert chunked_hash == single_hash
    _, spec_means = _spec(values, 1234, 1001)
    assert single.tobytes() == spec_means.tobytes()


def test_a_kept_small_draw_is_the_draw_a_fresh_stream_gives():
    """A small one-chunk draw is kept and reused (the audit resamples each bin of one size with
    one seed): its means and index digest are the spec's, the first call's and the second's, and
    no caller can write into the kept indices."""
    values = np.random.default_rng(11).normal(size=97)
    first, first_hash = replicate_means(values, seed=7, replicates=1000)
    hits = resample._small_draw.cache_info().hits
    again, again_hash = replicate_means(values, seed=7, replicates=1000)
    assert resample._small_draw.cache_info().hits > hits  # the second call drew nothing
    _, spec_means = _spec(values, 7, 1000)
    assert first.tobytes() == again.tobytes() == spec_means.tobytes()
    assert first_hash == again_hash == replicate_means(values, seed=7, replicates=1000, chunk_rows=333)[1]
    assert not resample._small_draw(7, 97, 1000).flags.writeable


def test_columns_resampled_together_are_each_the_one_column_call_bit_for_bit():
    """A 2-D call (the audit's proxy and auditors, one index draw) gives, row by row, exactly
    the 1-D call's means: the gather keeps each replicate's items contiguous, so each mean sums
    them in the same order."""
    columns = np.random.default_rng(5).normal(size=(3, 113))
    together, _ = replicate_means(columns, replicates=1000, chunk_rows=300, index_sha256=False)
    for row, values in zip(together, columns, strict=True):
        alone, _ = replicate_means(values, replicates=1000, index_sha256=False)
        assert row.tobytes() == alone.tobytes()


def test_default_chunking_equals_single_call_block():
    values = _accuracy_values(5000, 0.52)  # default chunk = 838 rows → 4 chunks, the last partial
    chunked = bootstrap_mean(values, statistic="accuracy", replicates=3000)
    single = bootstrap_mean(values, statistic="accuracy", replicates=3000, chunk_rows=3000)
    assert chunked == single


def test_percentile_interval_agrees_with_scipy():
    values = _accuracy_values(400, 0.62, seed=7)
    ours = bootstrap_mean(values, statistic="accuracy")
    theirs = stats.bootstrap(
        (values,), np.mean, n_resamples=10_000, method="percentile", confidence_level=0.95,
        random_state=np.random.default_rng(99), vectorized=True,
    )  # fmt: skip
    # Monte-Carlo error of a 2.5% quantile with 10k replicates is ~0.003 here; the
    # percentiles move in steps of 1/400 = 0.0025, so allow two steps plus noise.
    assert ours["ci_95"][0] == pytest.approx(theirs.confidence_interval.low, abs=0.008)
    assert ours["ci_95"][1] == pytest.approx(theirs.confidence_interval.high, abs=0.008)
    se = values.std() / np.sqrt(values.size)
    assert ours["lower_95"] == pytest.approx(values.mean() - 1.645 * se, abs=0.008)


def test_paired_bootstrap_uses_the_same_indices_for_both():
    a = _accuracy_values(200, 0.6, seed=1)
    b = _accuracy_values(200, 0.7, seed=2)
    block = paired_bootstrap(a, b, statistic="accuracy", replicates=2000)
    idx, _ = _spec(a, 1234, 2000)
    diff_means = (b[idx] - a[idx]).mean(axis=1)
    assert block["index_sha256"] == bootstrap_mean(a, statistic="x", replicates=2000)["index_sha256"]
    assert block["point"] == pytest.approx(b.mean() - a.mean(), abs=1e-15)
    assert block["ci_95"] == list(np.percentile(diff_means, [2.5, 97.5]))
    assert block["p_b_greater"] == np.mean(diff_means > 0)
    assert block["pass"] is bool(np.percentile(diff_means, 5) > 0)
    # paired resampling is tighter than resampling A and B independently when they agree often
    same = paired_bootstrap(a, a, statistic="accuracy", replicates=100)
    assert same["ci_95"] == [0.0, 0.0] and same["p_b_greater"] == 0.0


def test_refuses_bad_input():
    with pytest.raises(ValueError, match="NaN"):
        bootstrap_mean([1.0, float("nan")], statistic="accuracy")
    with pytest.raises(ValueError, match="non-empty"):
        bootstrap_mean([], statistic="accuracy")
    with pytest.raises(ValueError, match="equal lengths"):
        paired_bootstrap([1.0], [1.0, 0.0], statistic="accuracy")


def test_same_block_in_a_fresh_process():
    """No hidden state (global RNG, thread count, chunking): another interpreter gets the same bytes."""
    import json
    import os
    import subprocess
    import sys

    code = (
        "import json, numpy as np; from rewardplane.eval.bootstrap import bootstrap_mean; "
        "v = (np.random.default_rng(0).random(321) < 0.6).astype(float); "
        "print(json.dumps(bootstrap_mean(v, statistic='accuracy', replicates=1500, chunk_rows=100)))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    other = json.loads(
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, check=True).stdout
    )
    here = bootstrap_mean(_accuracy_values(321, 0.6), statistic="accuracy", replicates=1500)
    assert other == here
