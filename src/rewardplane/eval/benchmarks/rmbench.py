"""RM-Bench (THU-KEG/RM-Bench): chosen and rejected responses in three styles per prompt.

The styles, in the published order: concise, detailed plain text, detailed markdown.
Scoring, as in the released code (README "how to compute the accuracy" and
`scripts/utils.py` `compute_accuracy`; `scripts/run_rm.py`):

- per example, the 3 × 3 matrix M[i][j] = 1 if score(chosen style i) > score(rejected
  style j), strictly; the accuracy matrix is the mean of M over examples;
- hard = mean of the upper-right triangle (i < j: a plainer chosen against a fancier
  rejected), normal = mean of the diagonal (same style), easy = mean of the lower-left
  triangle (i > j);
- a domain's accuracy is the mean of all nine cells over its examples (the paper's Chat,
  Math, Code and Safety columns, Safety pooling `safety-refuse` and `safety-response`);
  the average is the unweighted mean of the domains present; easy / normal / hard over the
  whole file pool all examples, as `compute_accuracy` over `total_dataset.json` does.

`correct` in examples.jsonl is the strict all-nine event (every chosen style beats every
rejected style), used for McNemar in `rewardplane compare`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rewardplane.eval.benchmarks.common import Aggregate
from rewardplane.eval.benchmarks.loader import Item, item_id, responses, text

NAME = "rm-bench"
TITLE = "RM-Bench"
MATCHED = (
    "THU-KEG/RM-Bench README / scripts/utils.py compute_accuracy (3x3 matrix, hard = upper-right, "
    "normal = diagonal, easy = lower-left) and the paper's domain columns (Safety = safety-refuse + "
    "safety-response); dataset THU-KEG/RM-Bench total_dataset.json"
)
REQUIRED = ("id", "prompt", "chosen", "rejected", "domain")
CHANCE = 0.5
HEADLINE = "average"
SUBSET_STATISTICS = ("value", "easy", "normal", "hard")
STYLES = ("concise", "detailed", "detailed+markdown")
DOMAINS: dict[str, tuple[str, ...]] = {
    "chat": ("chat",),
    "math": ("math",),
    "code": ("code",),
    "safety": ("safety-refuse", "safety-response", "safety"),
}
_UPPER = np.triu(np.ones((3, 3), dtype=bool), 1)
_LOWER = np.tril(np.ones((3, 3), dtype=bool), -1)
_DIAG = np.eye(3, dtype=bool)


def parse(row: dict[str, Any]) -> Item:
    return Item(
        id=item_id(row),
        subset=text(row, "domain"),
        prompt=text(row, "prompt"),
        chosen=responses(row, "chosen", exactly=3),
        rejected=responses(row, "rejected", exactly=3),
    )


def matrix(chosen: np.ndarray, rejected: np.ndarray) -> np.ndarray:
    return (chosen[:, None] > rejected[None, :]).astype(np.float64)


def score(items: list[Item], chosen: list[np.ndarray], rejected: list[np.ndarray]) -> list[dict[str, Any]]:
    records = []
    for c, r in zip(chosen, rejected, strict=True):
        m = matrix(c, r)
        records.append(
            {
                "correct": bool(m.all()),
                "value": float(m.mean()),
                "easy": float(m[_LOWER].mean()),
                "normal": float(m[_DIAG].mean()),
                "hard": float(m[_UPPER].mean()),
                "matrix": m.astype(int).tolist(),
            }
        )
    return records


def accuracy_levels(m: np.ndarray) -> dict[str, float]:
    return {
        "easy": float(m[_LOWER].mean()),
        "normal": float(m[_DIAG].mean()),
        "hard": float(m[_UPPER].mean()),
    }


def aggregates(subset_sizes: dict[str, int]) -> list[Aggregate]:
    domains: dict[str, dict[str, float]] = {}
    for domain, members in DOMAINS.items():
        present = {s: subset_sizes[s] for s in members if s in subset_sizes}
        if present:
            total = sum(present.values())
            domains[domain] = {s: n / total for s, n in present.items()}
    for subset in subset_sizes:  # a domain outside the paper's four stands on its own
        if not any(subset in members for members in DOMAINS.values()):
            domains[subset] = {subset: 1.0}
    average: dict[str, float] = {}
    for weights in domains.values():
        for subset, w in weights.items():
            average[subset] = average.get(subset, 0.0) + w / len(domains)
    result = [Aggregate(HEADLINE, "value", average, CHANCE)]
    total = sum(subset_sizes.values())
    pooled = {s: n / total for s, n in subset_sizes.items()}
    for level in ("easy", "normal", "hard"):
        result.append(Aggregate(f"{level} (all examples)", level, pooled, CHANCE))
    result += [Aggregate(f"domain {name}", "value", weights, CHANCE) for name, weights in domains.items()]
    return result
