"""RM-Bench (THU-KEG/RM-Bench): chosen and rejected responses in three styles per prompt.

The styles, in the published order: concise, detailed plain text, detailed markdown.
Scoring, as in the released code (`scripts/utils.py` `compute_accuracy` and
`split_dataset_by_domain`, THU-KEG/RM-Bench 73c52d7; the README's "how to compute the
accuracy" and the leaderboard's definition):

- per example, the 3 × 3 matrix M[i][j] = 1 if score(chosen style i) > score(rejected
  style j), strictly;
- a row belongs to the domain its `domain` starts with: chat, math, code or safety (Safety
  pools `safety-refuse` and `safety-response` rows); a row of any other domain is rejected
  (`schema`), where the released code would silently leave it out;
- per domain, the accuracy matrix is the mean of M over the domain's examples; its hard =
  mean of the upper-right triangle (i < j: a plainer chosen against a fancier rejected),
  normal = mean of the diagonal (same style), easy = mean of the lower-left triangle (i > j);
  the domain's accuracy is the mean of the three (= the mean of all nine cells);
- **easy / normal / hard = the unweighted mean over the domains** of the domain's level, and
  the **average = the unweighted mean of the domain accuracies** (= the mean of the three
  levels): "Easy = (Safety_Easy + Math_Easy + Chat_Easy + Code_Easy) / 4". A level is not
  pooled over all rows: with unequal domain sizes that would weigh the large domains more.

`correct` in examples.jsonl is the strict all-nine event (every chosen style beats every
rejected style), used for McNemar in `rewardplane compare`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rewardplane.data import reasons as R
from rewardplane.data.reasons import Rejection
from rewardplane.eval.benchmarks.common import Aggregate
from rewardplane.eval.benchmarks.loader import Item, item_id, responses, text

NAME = "rm-bench"
TITLE = "RM-Bench"
MATCHED = (
    "THU-KEG/RM-Bench scripts/utils.py compute_accuracy at 73c52d7 (3x3 matrix per domain, hard = "
    "upper-right, normal = diagonal, easy = lower-left; easy / normal / hard and the average = the mean "
    "over the four domains chat, math, code, safety*); dataset THU-KEG/RM-Bench total_dataset.json"
)
# where --data comes from (docs/benchmarks.md#getting-the-data): nothing here downloads it
SOURCE = {
    "dataset": "THU-KEG/RM-Bench (GitHub) data/total_dataset.json at commit 73c52d7, the one scoring is"
    " matched against",
    "fetch": "curl -L -o total_dataset.json"
    " https://raw.githubusercontent.com/THU-KEG/RM-Bench/73c52d7/data/total_dataset.json",
    "file": "total_dataset.json",
    "sample": "tests/eval/fixtures/rmbench.json",
}
REQUIRED = ("id", "prompt", "chosen", "rejected", "domain")
CHANCE = 0.5
HEADLINE = "average"
SUBSET_STATISTICS = ("value", "easy", "normal", "hard")
LEVELS = ("easy", "normal", "hard")
STYLES = ("concise", "detailed", "detailed+markdown")
DOMAINS = ("chat", "math", "code", "safety")
"""The released `split_dataset_by_domain`: a row's domain is the first of these its `domain` starts with."""
MEAN_OVER_DOMAINS = "(mean over domains)"
_UPPER = np.triu(np.ones((3, 3), dtype=bool), 1)
_LOWER = np.tril(np.ones((3, 3), dtype=bool), -1)
_DIAG = np.eye(3, dtype=bool)


def domain_of(subset: str) -> str | None:
    return next((d for d in DOMAINS if subset.startswith(d)), None)


def parse(row: dict[str, Any]) -> Item:
    domain = text(row, "domain")
    if domain_of(domain) is None:
        raise Rejection(R.SCHEMA, f"domain {domain!r} starts with none of {', '.join(DOMAINS)}")
    return Item(
        id=item_id(row),
        subset=domain,
        prompt=text(row, "prompt"),
        chosen=responses(row, "chosen", exactly=3),
        rejected=responses(row, "rejected", exactly=3),
    )


def matrix(chosen: np.ndarray, rejected: np.ndarray) -> np.ndarray:
    return (chosen[:, None] > rejected[None, :]).astype(np.float64)


def accuracy_levels(m: np.ndarray) -> dict[str, float]:
    return {
        "easy": float(m[_LOWER].mean()),
        "normal": float(m[_DIAG].mean()),
        "hard": float(m[_UPPER].mean()),
    }


def score(items: list[Item], chosen: list[np.ndarray], rejected: list[np.ndarray]) -> list[dict[str, Any]]:
    records = []
    for c, r in zip(chosen, rejected, strict=True):
        m = matrix(c, r)
        records.append(
            {
                "correct": bool(m.all()),
                "value": float(m.mean()),
                **accuracy_levels(m),
                "matrix": m.astype(int).tolist(),
            }
        )
    return records


def domain_weights(subset_sizes: dict[str, int]) -> dict[str, dict[str, float]]:
    """Domain → {subset: its share of the domain's rows}, for the domains present."""
    out: dict[str, dict[str, float]] = {}
    for domain in DOMAINS:
        present = {s: n for s, n in subset_sizes.items() if domain_of(s) == domain}
        if present:
            total = sum(present.values())
            out[domain] = {s: n / total for s, n in present.items()}
    return out


def aggregates(subset_sizes: dict[str, int]) -> list[Aggregate]:
    domains = domain_weights(subset_sizes)
    mean_over_domains: dict[str, float] = {}
    for weights in domains.values():
        for subset, w in weights.items():
            mean_over_domains[subset] = mean_over_domains.get(subset, 0.0) + w / len(domains)
    result = [Aggregate(HEADLINE, "value", mean_over_domains, CHANCE)]
    result += [Aggregate(level, level, mean_over_domains, CHANCE) for level in LEVELS]
    result += [Aggregate(f"domain {name}", "value", weights, CHANCE) for name, weights in domains.items()]
    return result


def style_matrices(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The accuracy matrix and its levels per domain, and their mean over domains (whose levels
    are the released easy / normal / hard)."""
    out: dict[str, Any] = {"styles": list(STYLES)}
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(domain_of(row["subset"]) or row["subset"], []).append(row)
    per_domain = {}
    for domain in DOMAINS:
        if domain in groups:
            m = np.mean([np.array(r["matrix"], dtype=np.float64) for r in groups[domain]], axis=0)
            per_domain[domain] = m
            out[domain] = {"matrix": m.tolist(), **accuracy_levels(m), "n": len(groups[domain])}
    m = np.mean(list(per_domain.values()), axis=0)
    out[MEAN_OVER_DOMAINS] = {"matrix": m.tolist(), **accuracy_levels(m), "n": len(rows)}
    return out
