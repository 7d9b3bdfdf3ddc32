"""What the three benchmarks share: aggregates as fixed weights over subsets, the bootstrap of
every number, the per-example artifact, the length-bias check and the worst pairs.

Every reported number is a weighted mean of subset means, score = Σ_s w_s · mean_s(x), with
weights that sum to 1. Writing it as the plain mean of a per-example value

    v_i = N · w_s(i) / n_s(i) · x_i      (N examples in the aggregate's subsets)

gives exactly the same point estimate and lets the project's bootstrap (`bootstrap_mean`:
resample examples, mean of v) put an interval on it, with the weights held fixed. The
weights are re-derived from the subsets present, so anyone can recompute every figure from
examples.jsonl alone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rewardplane.eval import bootstrap

EXAMPLES_FILE = "examples.jsonl"
SUMMARY_SCHEMA = "rewardplane.eval.benchmark/1"
EXAMPLE_SCHEMA_KEYS = ("id", "subset", "chosen_scores", "rejected_scores", "correct", "value")
WORST_PAIRS = 10
RANGE = (0.0, 1.0)  # a subset's statistic (1/0, 1/k, a cell mean) unless its module's RANGES says otherwise
TEXT_PREVIEW_CHARS = 1500


@dataclass(frozen=True)
class Aggregate:
    """score = Σ_s weights[s] · mean over subset s of `statistic` (weights sum to 1)."""

    name: str
    statistic: str
    weights: dict[str, float]
    threshold: float


def aggregate_values(
    subsets: Sequence[str], values: np.ndarray, weights: dict[str, float]
) -> tuple[np.ndarray, np.ndarray]:
    """(mask of the examples in the aggregate, their per-example values v_i) — mean(v) is the score."""
    labels = np.asarray(subsets, dtype=object)
    mask = np.isin(labels, list(weights))
    n_total = int(mask.sum())
    v = np.zeros(n_total, dtype=np.float64)
    inside = np.flatnonzero(mask)
    for name, w in weights.items():
        members = labels[inside] == name
        n_s = int(members.sum())
        if n_s:
            v[members] = n_total * w / n_s * values[inside][members]
    return mask, v


def subset_range(name: str, ranges: dict[str, tuple[float, float]]) -> tuple[float, float]:
    """The range subset `name`'s mean can take: its interval is clipped to it."""
    return ranges.get(name, RANGE)


def weighted_range(weights: dict[str, float], ranges: dict[str, tuple[float, float]]) -> tuple[float, float]:
    """The range of Σ_s w_s · mean_s: its rescaled per-example values can resample beyond it."""
    return (
        sum(w * subset_range(s, ranges)[0] for s, w in weights.items()),
        sum(w * subset_range(s, ranges)[1] for s, w in weights.items()),
    )


def difference_range(bounds: tuple[float, float]) -> tuple[float, float]:
    """The range of B − A for two statistics that each lie in `bounds`."""
    return (bounds[0] - bounds[1], bounds[1] - bounds[0])


def statistics_block(
    records: list[dict[str, Any]],
    subset_statistics: Sequence[str],
    aggregates: list[Aggregate],
    chance: float,
    *,
    seed: int,
    replicates: int,
    ranges: dict[str, tuple[float, float]] | None = None,
) -> dict[str, Any]:
    """Per-subset and aggregate numbers, each with its bootstrap block, its interval within the
    number's range (`ranges`: a subset's, where it is not [0, 1])."""
    ranges = ranges or {}
    subsets = [r["subset"] for r in records]
    per_subset: dict[str, Any] = {}
    for name in sorted(set(subsets)):
        rows = [r for r in records if r["subset"] == name]
        entry: dict[str, Any] = {"n": len(rows), "correct": sum(r["correct"] for r in rows)}
        for stat in subset_statistics:
            values = np.array([r[stat] for r in rows], dtype=np.float64)
            block = bootstrap.bootstrap_mean(
                values, statistic=f"{name}: {stat}", seed=seed, replicates=replicates, threshold=chance,
                bounds=subset_range(name, ranges),
            )  # fmt: skip
            entry[stat] = block["point"]
            entry[f"bootstrap_{stat}" if stat != "value" else "bootstrap"] = block
        per_subset[name] = entry
    per_aggregate: dict[str, Any] = {}
    for agg in aggregates:
        values = np.array([r[agg.statistic] for r in records], dtype=np.float64)
        mask, v = aggregate_values(subsets, values, agg.weights)
        if not mask.any():
            continue
        block = bootstrap.bootstrap_mean(
            v, statistic=f"{agg.name} (weighted per-example value)", seed=seed, replicates=replicates,
            threshold=agg.threshold, bounds=weighted_range(agg.weights, ranges),
        )  # fmt: skip
        per_aggregate[agg.name] = {
            "statistic": agg.statistic,
            "weights": dict(sorted(agg.weights.items())),
            "n": int(mask.sum()),
            "score": block["point"],
            "bootstrap": block,
        }
    return {"subsets": per_subset, "aggregates": per_aggregate}


# ---- length bias ---------------------------------------------------------------------------------
def _ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean rank), as Spearman's correlation uses."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(values.size, dtype=np.float64)
    ranks[order] = np.arange(values.size, dtype=np.float64)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]


def _pearson(x: np.ndarray, y: np.ndarray) -> float | None:
    if x.size < 3 or np.std(x) == 0 or np.std(y) == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def length_bias(
    chosen_scores: Sequence[Sequence[float]],
    rejected_scores: Sequence[Sequence[float]],
    chosen_lengths: Sequence[Sequence[int]],
    rejected_lengths: Sequence[Sequence[int]],
    unit: str,
) -> dict[str, Any]:
    """Accuracy of every chosen-vs-rejected comparison split by which response is longer, and
    the correlation of score with length over all scored responses (each text counted once per
    example it appears in)."""
    buckets = {"chosen_longer": [0, 0], "chosen_shorter": [0, 0], "same_length": [0, 0]}
    scores: list[float] = []
    lengths: list[float] = []
    for cs, rs, cl, rl in zip(chosen_scores, rejected_scores, chosen_lengths, rejected_lengths, strict=True):
        scores += [*cs, *rs]
        lengths += [*cl, *rl]
        for c, lc in zip(cs, cl, strict=True):
            for r, lr in zip(rs, rl, strict=True):
                key = "chosen_longer" if lc > lr else "chosen_shorter" if lc < lr else "same_length"
                buckets[key][0] += 1
                buckets[key][1] += int(c > r)
    out: dict[str, Any] = {"unit": unit}
    for key, (n, won) in buckets.items():
        out[key] = {"comparisons": n, "accuracy": won / n if n else None}
    s = np.asarray(scores, dtype=np.float64)
    ln = np.asarray(lengths, dtype=np.float64)
    out["pearson_score_length"] = _pearson(s, ln)
    out["spearman_score_length"] = _pearson(_ranks(s), _ranks(ln)) if s.size >= 3 else None
    longer, shorter = out["chosen_longer"]["accuracy"], out["chosen_shorter"]["accuracy"]
    out["gap"] = longer - shorter if longer is not None and shorter is not None else None
    return out


# ---- worst pairs ---------------------------------------------------------------------------------
def _preview(text: str) -> str:
    return text if len(text) <= TEXT_PREVIEW_CHARS else text[:TEXT_PREVIEW_CHARS] + f" … [{len(text)} chars]"


def worst_pairs(items: list[Any], rows: list[dict[str, Any]], k: int = WORST_PAIRS) -> list[dict[str, Any]]:
    """The k wrong examples with the largest wrong margin: best rejected score − worst chosen score."""
    wrong = []
    for item, row in zip(items, rows, strict=True):
        if row["correct"]:
            continue
        c = int(np.argmin(row["chosen_scores"]))
        r = int(np.argmax(row["rejected_scores"]))
        margin = row["rejected_scores"][r] - row["chosen_scores"][c]
        wrong.append((margin, item, row, c, r))
    wrong.sort(key=lambda entry: (-entry[0], entry[1].id))
    return [
        {
            "id": item.id,
            "subset": item.subset,
            "wrong_margin": float(margin),
            "chosen_score": row["chosen_scores"][c],
            "rejected_score": row["rejected_scores"][r],
            "chosen_index": c,
            "rejected_index": r,
            "prompt": _preview(item.prompt),
            "chosen": _preview(item.chosen[c]),
            "rejected": _preview(item.rejected[r]),
        }
        for margin, item, row, c, r in wrong[:k]
    ]


def example_lines(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(row, allow_nan=False, ensure_ascii=False) + "\n" for row in rows).encode(
        "utf-8"
    )
