"""Compare two evaluations of the same frozen probe: is model B better than model A?

Three numbers, each answering a different question:
- the paired bootstrap of accuracy(B) − accuracy(A) (same resample indices for both), its
  95% interval and P(B > A) over replicates: how large is the gain, and how sure are we;
- the exact McNemar test on the discordant pairs (A right / B wrong vs A wrong / B right):
  could a difference this lopsided arise if the models were equally good;
- the same per subset, because a gain on one subset can hide a loss on another.

Only evaluations of the same probe (hash) covering the same pair ids are comparable; anything
else is refused with what differs. Each side's pairs that are in its model's training data (the
rows' `in_training`, `rewardplane.data.overlap`) are counted in `train_overlap`: a model scored on
pairs it was trained on can look significantly better than an honest one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rewardplane.core.errors import UsageError
from rewardplane.data.overlap import is_clean, overlap_line
from rewardplane.eval import bootstrap, metrics
from rewardplane.eval.artifacts import read_pairs

COMPARISON_SCHEMA = "rewardplane.eval.comparison/1"


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value: 2·P(X ≤ min(b, c)), X ~ Binomial(b + c, 1/2), capped at 1.

    Computed with integers (binomial coefficients summed exactly, one correctly rounded
    division at the end), so it is exact for any number of discordant pairs.
    """
    if a_only < 0 or b_only < 0:
        raise ValueError("discordant counts must be >= 0")
    total = a_only + b_only
    if total == 0:
        return 1.0
    tail = 0
    coefficient = 1  # C(total, 0)
    for k in range(min(a_only, b_only) + 1):
        tail += coefficient
        coefficient = coefficient * (total - k) // (k + 1)
    return min(1.0, (2 * tail) / (1 << total))


def _align(rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]], name_a: str, name_b: str) -> list[int]:
    """Positions of A's pairs in B, after refusing different probes, id sets or subsets."""
    probe_a, probe_b = rows_a[0]["probe_sha256"], rows_b[0]["probe_sha256"]
    if probe_a != probe_b:
        raise UsageError(
            f"different probes: {name_a} has probe_sha256 {probe_a[:12]}…, {name_b} has {probe_b[:12]}…",
            code="probe_mismatch",
        )
    position_b = {row["pair_id"]: i for i, row in enumerate(rows_b)}
    ids_a = [row["pair_id"] for row in rows_a]
    only_a = [pid for pid in ids_a if pid not in position_b]
    only_b = sorted(set(position_b) - set(ids_a))
    if only_a or only_b:
        raise UsageError(
            f"different pair ids: {len(only_a)} only in {name_a} (e.g. {only_a[:3]}), "
            f"{len(only_b)} only in {name_b} (e.g. {only_b[:3]})",
            code="pair_ids_mismatch",
        )
    order = [position_b[pid] for pid in ids_a]
    for row, j in zip(rows_a, order, strict=True):
        if row["subset"] != rows_b[j]["subset"]:
            raise UsageError(
                f"pair {row['pair_id']!r} is in subset {row['subset']!r} in {name_a} "
                f"but {rows_b[j]['subset']!r} in {name_b}",
                code="subset_mismatch",
            )
    return order


def _difference(correct_a: np.ndarray, correct_b: np.ndarray) -> dict[str, Any]:
    a_only = int(np.sum(correct_a & ~correct_b))
    b_only = int(np.sum(~correct_a & correct_b))
    return {
        "n_pairs": int(correct_a.size),
        "accuracy_a": float(correct_a.mean()),
        "accuracy_b": float(correct_b.mean()),
        "difference": float(correct_b.mean() - correct_a.mean()),
        "discordant_a_only": a_only,
        "discordant_b_only": b_only,
        "mcnemar_p": mcnemar_exact(a_only, b_only),
    }


def train_overlap(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A `train_overlap` entry from one evaluation's rows: how many are in its model's training data."""
    flags = [row.get("in_training") for row in rows]
    if any(not isinstance(flag, bool) for flag in flags):
        return {
            "checked": False,
            "reason": "its pairs.jsonl has no in_training flags (written before training overlap was"
            " checked, or for a model that records no training data)",
        }
    return {"checked": True, "pairs": sum(flags), "evaluated": len(flags)}


def compare_pairs(
    path_a: str | Path,
    path_b: str | Path,
    *,
    seed: int = bootstrap.DEFAULT_SEED,
    replicates: int = bootstrap.DEFAULT_REPLICATES,
    strict_overlap: bool = False,
) -> dict[str, Any]:
    """The comparison document for B − A, in A's (probe) order. `strict_overlap` refuses unless
    both sides were checked against their models' training data and neither overlaps it."""
    rows_a, rows_b = read_pairs(path_a), read_pairs(path_b)
    order = _align(rows_a, rows_b, str(path_a), str(path_b))
    overlap = {"a": train_overlap(rows_a), "b": train_overlap(rows_b)}
    if strict_overlap:
        for side, entry in overlap.items():
            if not is_clean(entry):
                raise UsageError(
                    f"--strict-overlap: {side.upper()}: {overlap_line(entry, f'model {side.upper()}')}",
                    code="train_overlap",
                )
    rows_b = [rows_b[j] for j in order]
    correct_a = np.array([row["correct"] for row in rows_a], dtype=bool)
    correct_b = np.array([row["correct"] for row in rows_b], dtype=bool)
    credit_a = metrics.tie_aware_credit(np.array([row["margin"] for row in rows_a], dtype=np.float64))
    credit_b = metrics.tie_aware_credit(np.array([row["margin"] for row in rows_b], dtype=np.float64))
    subsets = [row["subset"] for row in rows_a]

    per_subset: dict[str, Any] = {}
    for name in sorted({s for s in subsets if s is not None}):
        mask = np.array([s == name for s in subsets], dtype=bool)
        entry = _difference(correct_a[mask], correct_b[mask])
        entry["bootstrap"] = bootstrap.paired_bootstrap(
            correct_a[mask], correct_b[mask], statistic="accuracy", seed=seed, replicates=replicates
        )
        per_subset[name] = entry
    return {
        "schema": COMPARISON_SCHEMA,
        "a": str(path_a),
        "b": str(path_b),
        "probe_sha256": rows_a[0]["probe_sha256"],
        **_difference(correct_a, correct_b),
        "bootstrap": {
            "strict": bootstrap.paired_bootstrap(
                correct_a, correct_b, statistic="accuracy (strict)", seed=seed, replicates=replicates
            ),
            "tie_aware": bootstrap.paired_bootstrap(
                credit_a, credit_b, statistic="accuracy_tie_aware", seed=seed, replicates=replicates
            ),
        },
        "subsets": per_subset,
        "train_overlap": overlap,
    }


def format_table(comparison: dict[str, Any]) -> str:
    """Plain-text table: one line for all pairs, one per subset."""
    header = (
        f"{'subset':<20} {'n':>7} {'acc A':>7} {'acc B':>7} {'B-A':>8} "
        f"{'95% interval':>19} {'P(B>A)':>7} {'A-only':>6} {'B-only':>6} {'McNemar p':>10}"
    )
    lines = [header, "-" * len(header)]
    entries = [("(all)", comparison, comparison["bootstrap"]["strict"])]
    entries += [(name, entry, entry["bootstrap"]) for name, entry in comparison["subsets"].items()]
    for name, entry, block in entries:
        low, high = block["ci_95"]
        lines.append(
            f"{name[:20]:<20} {entry['n_pairs']:>7} {entry['accuracy_a']:>7.4f} {entry['accuracy_b']:>7.4f} "
            f"{entry['difference']:>+8.4f} {f'[{low:+.4f}, {high:+.4f}]':>19} {block['p_b_greater']:>7.4f} "
            f"{entry['discordant_a_only']:>6} {entry['discordant_b_only']:>6} {entry['mcnemar_p']:>10.4g}"
        )
    return "\n".join(lines)


BENCHMARK_COMPARISON_SCHEMA = "rewardplane.eval.benchmark_comparison/1"


def _benchmark_difference(
    name: str, correct_a: np.ndarray, correct_b: np.ndarray, v_a: np.ndarray, v_b: np.ndarray, *,
    statistic: str, seed: int, replicates: int, bounds: tuple[float, float],
) -> dict[str, Any]:  # fmt: skip
    a_only = int(np.sum(correct_a & ~correct_b))
    b_only = int(np.sum(~correct_a & correct_b))
    block = bootstrap.paired_bootstrap(
        v_a, v_b, statistic=f"{name}: {statistic}", seed=seed, replicates=replicates,
        bounds=bounds,
    )  # fmt: skip
    return {
        "n_pairs": int(v_a.size),
        "accuracy_a": float(v_a.mean()),
        "accuracy_b": float(v_b.mean()),
        "difference": float(v_b.mean() - v_a.mean()),
        "discordant_a_only": a_only,
        "discordant_b_only": b_only,
        "mcnemar_p": mcnemar_exact(a_only, b_only),
        "bootstrap": block,
    }


def compare_examples(
    path_a: str | Path,
    path_b: str | Path,
    *,
    seed: int = bootstrap.DEFAULT_SEED,
    replicates: int = bootstrap.DEFAULT_REPLICATES,
) -> dict[str, Any]:
    """B − A on two benchmark evaluations (`examples.jsonl`), paired by example id.

    Every aggregate (the benchmark score, sections / domains) and every subset gets the paired
    bootstrap of the per-example values (the same weighted values `rewardplane eval --benchmark`
    bootstrapped, so the point difference is exactly score(B) − score(A)), P(B > A), and the
    exact McNemar test on the strict per-example `correct`.
    """
    from rewardplane.eval.benchmarks import common
    from rewardplane.eval.benchmarks.runner import get, read_examples

    rows_a, rows_b = read_examples(path_a), read_examples(path_b)
    bench_a, bench_b = rows_a[0]["benchmark"], rows_b[0]["benchmark"]
    if bench_a != bench_b:
        raise UsageError(
            f"different benchmarks: {path_a} is {bench_a}, {path_b} is {bench_b}", code="probe_mismatch"
        )
    if rows_a[0]["data_sha256"] != rows_b[0]["data_sha256"]:
        raise UsageError(
            f"different data: {path_a} has data_sha256 {rows_a[0]['data_sha256'][:12]}…, "
            f"{path_b} has {rows_b[0]['data_sha256'][:12]}…",
            code="data_mismatch",
        )
    keyed = [{"pair_id": r["id"], "subset": r["subset"]} for r in rows_a]
    keyed_b = [{"pair_id": r["id"], "subset": r["subset"]} for r in rows_b]
    for rows in (keyed, keyed_b):
        rows[0]["probe_sha256"] = rows_a[0]["data_sha256"]
    order = _align(keyed, keyed_b, str(path_a), str(path_b))
    rows_b = [rows_b[j] for j in order]
    module = get(bench_a)
    ranges = getattr(module, "RANGES", {})
    subsets = [r["subset"] for r in rows_a]
    correct_a = np.array([r["correct"] for r in rows_a], dtype=bool)
    correct_b = np.array([r["correct"] for r in rows_b], dtype=bool)
    sizes: dict[str, int] = {}
    for s in subsets:
        sizes[s] = sizes.get(s, 0) + 1
    aggregates: dict[str, Any] = {}
    for agg in module.aggregates(sizes):
        va = np.array([r[agg.statistic] for r in rows_a], dtype=np.float64)
        vb = np.array([r[agg.statistic] for r in rows_b], dtype=np.float64)
        mask, wa = common.aggregate_values(subsets, va, agg.weights)
        _, wb = common.aggregate_values(subsets, vb, agg.weights)
        if mask.any():
            aggregates[agg.name] = _benchmark_difference(
                agg.name, correct_a[mask], correct_b[mask], wa, wb,
                statistic=agg.statistic, seed=seed, replicates=replicates,
                bounds=common.difference_range(common.weighted_range(agg.weights, ranges)),
            )  # fmt: skip
    per_subset: dict[str, Any] = {}
    for name in sorted(sizes):
        mask = np.array([s == name for s in subsets], dtype=bool)
        va = np.array([r["value"] for r, m in zip(rows_a, mask, strict=True) if m], dtype=np.float64)
        vb = np.array([r["value"] for r, m in zip(rows_b, mask, strict=True) if m], dtype=np.float64)
        per_subset[name] = _benchmark_difference(
            name,
            correct_a[mask],
            correct_b[mask],
            va,
            vb,
            statistic="value",
            seed=seed,
            replicates=replicates,
            bounds=common.difference_range(common.subset_range(name, ranges)),
        )
    return {
        "schema": BENCHMARK_COMPARISON_SCHEMA,
        "benchmark": bench_a,
        "a": str(path_a),
        "b": str(path_b),
        "data_sha256": rows_a[0]["data_sha256"],
        "aggregates": aggregates,
        "subsets": per_subset,
    }


def format_benchmark_table(comparison: dict[str, Any]) -> str:
    """Plain-text table: one line per aggregate, then one per subset (score, not accuracy, where weighted)."""
    header = (
        f"{'':<28} {'n':>6} {'A':>7} {'B':>7} {'B-A':>8} "
        f"{'95% interval':>19} {'P(B>A)':>7} {'A-only':>6} {'B-only':>6} {'McNemar p':>10}"
    )
    lines = [header, "-" * len(header)]
    entries = list(comparison["aggregates"].items()) + [
        (f"  {k}", v) for k, v in comparison["subsets"].items()
    ]
    for name, entry in entries:
        block = entry["bootstrap"]
        low, high = block["ci_95"]
        lines.append(
            f"{name[:28]:<28} {entry['n_pairs']:>6} {entry['accuracy_a']:>7.4f} {entry['accuracy_b']:>7.4f} "
            f"{entry['difference']:>+8.4f} {f'[{low:+.4f}, {high:+.4f}]':>19} {block['p_b_greater']:>7.4f} "
            f"{entry['discordant_a_only']:>6} {entry['discordant_b_only']:>6} {entry['mcnemar_p']:>10.4g}"
        )
    return "\n".join(lines)
