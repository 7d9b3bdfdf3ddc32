"""Per-pair preference metrics, with the exact definitions every artifact uses.

- margin = chosen_score − rejected_score
- correct (strict) = margin > 0: a tie never counts as a win
- tie = |margin| ≤ TIE_TOLERANCE (1e-6): scores this close are not a preference in fp32
- tie-aware credit = 0.5 for a tie, else 1 for margin > 0 and 0 otherwise, so a model that
  scores everything equal gets 0.5 (chance), not 0 (strict) — both numbers are reported
- pair_loss defaults to the Bradley–Terry loss −log σ(margin) in float64; DPO callers pass
  their own per-pair losses
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

TIE_TOLERANCE = 1e-6


def finite_array(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
        raise ValueError(f"{name} has {bad.size} NaN/infinite value(s), first at position {int(bad[0])}")
    return array


def margins(chosen: Sequence[float] | np.ndarray, rejected: Sequence[float] | np.ndarray) -> np.ndarray:
    """chosen − rejected in float64, refusing missing or non-finite scores (no failure becomes a score)."""
    c = finite_array(chosen, "chosen scores")
    r = finite_array(rejected, "rejected scores")
    if c.shape != r.shape:
        raise ValueError(f"{c.size} chosen scores but {r.size} rejected scores")
    return c - r


def strict_correct(margin: np.ndarray) -> np.ndarray:
    return margin > 0


def ties(margin: np.ndarray) -> np.ndarray:
    return np.abs(margin) <= TIE_TOLERANCE


def tie_aware_credit(margin: np.ndarray) -> np.ndarray:
    """1 / 0.5 / 0 per pair: the statistic behind `accuracy_tie_aware`."""
    return np.where(ties(margin), 0.5, (margin > 0).astype(np.float64))


def bradley_terry_loss(margin: np.ndarray) -> np.ndarray:
    """−log σ(margin) = log(1 + e^(−margin)), computed without overflow."""
    return np.logaddexp(0.0, -margin)


def summarize(margin: np.ndarray, pair_loss: np.ndarray) -> dict[str, Any]:
    """Headline numbers over a set of pairs (all pairs, or one subset)."""
    return {
        "n_pairs": int(margin.size),
        "accuracy": float(strict_correct(margin).mean()),
        "tie_rate": float(ties(margin).mean()),
        "accuracy_tie_aware": float(tie_aware_credit(margin).mean()),
        "margin_mean": float(margin.mean()),
        "loss_mean": float(pair_loss.mean()),
    }


def per_subset(margin: np.ndarray, pair_loss: np.ndarray, subsets: Sequence[str | None]) -> dict[str, Any]:
    """`summarize` for every named subset, sorted by name; pairs without a subset are left out here."""
    labels = np.asarray([s if s is not None else "" for s in subsets], dtype=object)
    has_label = np.asarray([s is not None for s in subsets], dtype=bool)
    out: dict[str, Any] = {}
    for name in sorted({s for s in subsets if s is not None}):
        mask = has_label & (labels == name)
        out[name] = summarize(margin[mask], pair_loss[mask])
    return out
