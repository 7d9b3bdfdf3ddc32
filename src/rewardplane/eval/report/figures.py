"""The report's figures (each a PNG as bytes) and the calibration numbers they plot."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rewardplane.eval import metrics
from rewardplane.eval.benchmarks.rmbench import MEAN_OVER_DOMAINS
from rewardplane.eval.report.page import png, pyplot

CALIBRATION_BINS = 10
_CURVES = (
    ("loss", ("loss",)),
    ("accuracy", ("accuracy", "tie_rate")),
    ("scores", ("margin_mean", "chosen_mean", "rejected_mean")),
    ("grad norm", ("grad_norm",)),
    ("learning rate", ("lr",)),
)


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for row in rows:
        value = row.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            steps.append(row["step"])
            values.append(float(value))
    return steps, values


def training_curves_png(rows: list[dict[str, Any]]) -> bytes | None:
    panels = [(title, keys) for title, keys in _CURVES if any(_series(rows, k)[0] for k in keys)]
    if not panels:
        return None
    plt = pyplot()
    columns = min(3, len(panels))
    lines = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(lines, columns, figsize=(4.2 * columns, 3.2 * lines), squeeze=False)
    for ax, (title, keys) in zip(axes.flat, panels, strict=False):
        for key in keys:
            steps, values = _series(rows, key)
            if steps:
                ax.plot(steps, values, label=key, linewidth=1.4)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(keys) > 1:
            ax.legend(fontsize=8)
        if title == "learning rate":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle("Training (per logged step)")
    fig.tight_layout()
    return png(fig)


def eval_curve_png(evals: list[tuple[int, dict[str, Any]]]) -> bytes:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    steps = [step for step, _ in evals]
    strict = [summary["bootstrap"]["strict"] for _, summary in evals]
    points = np.array([b["point"] for b in strict])
    low = np.array([b["ci_95"][0] for b in strict])
    high = np.array([b["ci_95"][1] for b in strict])
    # two evaluations (run.eval_every: 0: step 0 and the last) are points: a line between them would
    # draw a path the run was never measured on
    joined = len(steps) >= 3
    ax.errorbar(
        steps, points, yerr=[points - low, high - points], color="C0", marker="o", capsize=4,
        linestyle="-" if joined else "none", label="accuracy (strict), 95% interval",
    )  # fmt: skip
    tie_aware = [summary["accuracy_tie_aware"] for _, summary in evals]
    ax.plot(
        steps, tie_aware, color="C1", marker="o", markersize=10, fillstyle="none", zorder=3,
        linestyle="--" if joined else "none", label="accuracy (tie-aware)",
    )  # fmt: skip
    ax.axhline(0.5, color="grey", linewidth=1, linestyle=":", label="chance (0.5)")
    ax.set_xlabel("training step")
    ax.set_ylabel("probe accuracy")
    ax.set_title(f"Evaluation on the frozen probe (n = {evals[-1][1]['n_pairs']} pairs)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return png(fig)


def histogram_png(chosen: np.ndarray, rejected: np.ndarray, step_label: str) -> bytes:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    bins = np.histogram_bin_edges(np.concatenate([chosen, rejected]), bins=40)
    ax.hist(chosen, bins=bins, alpha=0.55, label=f"chosen (mean {chosen.mean():.3f})", color="C2")
    ax.hist(rejected, bins=bins, alpha=0.55, label=f"rejected (mean {rejected.mean():.3f})", color="C3")
    ax.set_xlabel("score")
    ax.set_ylabel("pairs")
    ax.set_title(f"Chosen vs rejected scores ({step_label})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return png(fig)


def calibration_table(margin: np.ndarray, bins: int = CALIBRATION_BINS) -> list[dict[str, Any]]:
    """Bin pairs by p = σ(|margin|), the model's probability that its preferred response is the chosen one.

    Observed win rate per bin is the tie-aware accuracy there (a tie counts one half). A
    calibrated Bradley–Terry model has observed ≈ predicted in every bin.
    """
    predicted = 1.0 / (1.0 + np.exp(-np.abs(margin)))
    credit = metrics.tie_aware_credit(margin)
    edges = np.linspace(0.5, 1.0, bins + 1)
    which = np.clip(np.searchsorted(edges, predicted, side="right") - 1, 0, bins - 1)
    table = []
    for b in range(bins):
        mask = which == b
        if mask.any():
            table.append(
                {
                    "low": float(edges[b]),
                    "high": float(edges[b + 1]),
                    "n": int(mask.sum()),
                    "predicted": float(predicted[mask].mean()),
                    "observed": float(credit[mask].mean()),
                }
            )
    return table


def expected_calibration_error(table: list[dict[str, Any]]) -> float:
    total = sum(row["n"] for row in table)
    return sum(row["n"] * abs(row["observed"] - row["predicted"]) for row in table) / total


def calibration_png(table: list[dict[str, Any]], step_label: str) -> bytes:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.8, 4.4))
    ax.plot([0.5, 1.0], [0.5, 1.0], color="grey", linestyle=":", label="perfect calibration")
    predicted = [row["predicted"] for row in table]
    observed = [row["observed"] for row in table]
    counts = np.array([row["n"] for row in table], dtype=float)
    ax.plot(predicted, observed, color="C0", linewidth=1)
    ax.scatter(
        predicted,
        observed,
        s=20 + 180 * counts / counts.max(),
        color="C0",
        zorder=3,
        label="bins (size = pairs)",
    )
    for x, y, n in zip(predicted, observed, counts, strict=True):
        ax.annotate(str(int(n)), (x, y), textcoords="offset points", xytext=(5, -10), fontsize=7)
    ax.set_xlim(0.48, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("predicted  σ(|margin|)")
    ax.set_ylabel("observed win rate (tie = ½)")
    ax.set_title(f"Calibration ({step_label}), ECE {expected_calibration_error(table):.3f}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return png(fig)


def forest_png(
    rows: list[tuple[str, float, float, float, int]], chance: float, title: str, reference: str = "chance"
) -> bytes:
    """One line per (label, point, low, high, n): the point and its 95% interval, `reference` dotted.
    The dotted line is named in the axis label, not a legend, which would cover a bar."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.0, 0.9 + 0.42 * len(rows)))
    ys = np.arange(len(rows))[::-1]
    for y, (label, point, low, high, _) in zip(ys, rows, strict=True):
        bold = label.startswith("(") or label == rows[0][0]
        ax.plot([low, high], [y, y], color="C0" if not bold else "C3", linewidth=2.2 if bold else 1.6)
        ax.plot([point], [y], marker="D" if bold else "o", color="C0" if not bold else "C3", markersize=7)
    ax.axvline(chance, color="grey", linestyle=":", linewidth=1)
    ax.set_yticks(ys, [f"{label}  (n={n})" for label, _, _, _, n in rows], fontsize=8)
    lows = [r[2] for r in rows] + [chance]
    highs = [r[3] for r in rows] + [chance]
    pad = 0.05 * max(1e-3, max(highs) - min(lows))
    ax.set_xlim(min(lows) - pad, max(highs) + pad)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel(f"with its 95% bootstrap interval; dotted line: {reference} ({chance:g})")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, axis="x")
    return png(fig)


def length_bias_png(bias: dict[str, Any], label: str) -> bytes:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 3.4))
    keys = [k for k in ("chosen_longer", "same_length", "chosen_shorter") if bias[k]["comparisons"]]
    values = [bias[k]["accuracy"] for k in keys]
    bars = ax.bar([k.replace("_", " ") for k in keys], values, color=["C2", "C7", "C3"][: len(keys)])
    for bar, key in zip(bars, keys, strict=True):
        ax.annotate(
            f"{bias[key]['accuracy']:.3f}\nn={bias[key]['comparisons']}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center", va="bottom", fontsize=8,
        )  # fmt: skip
    ax.axhline(0.5, color="grey", linestyle=":", linewidth=1)
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("accuracy of the comparisons")
    rho = bias.get("spearman_score_length")
    ax.set_title(
        f"Length bias ({label}; length in {bias['unit']})"
        + (f", Spearman(score, length) {rho:+.2f}" if rho is not None else ""),
        fontsize=9,
    )
    ax.grid(alpha=0.3, axis="y")
    return png(fig)


def style_png(style: dict[str, Any]) -> bytes:
    """RM-Bench: the 3 × 3 accuracy matrix (the mean over domains; pooled in summaries written
    before the released per-domain averaging was matched) and easy / normal / hard per domain."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.0, 3.8), gridspec_kw={"width_ratios": [1, 1.4]})
    styles = style["styles"]
    overall = MEAN_OVER_DOMAINS if MEAN_OVER_DOMAINS in style else "(all)"
    matrix = np.array(style[overall]["matrix"])
    image = left.imshow(matrix, vmin=0, vmax=1, cmap="RdYlGn")
    for i in range(3):
        for j in range(3):
            left.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=9)
    left.set_xticks(range(3), styles, fontsize=7, rotation=15)
    left.set_yticks(range(3), styles, fontsize=7)
    left.set_xlabel("rejected style")
    left.set_ylabel("chosen style")
    left.set_title("P(chosen > rejected), all domains\nupper right = hard, diagonal = normal", fontsize=9)
    fig.colorbar(image, ax=left, fraction=0.046)
    names = [k for k in style if k not in ("styles",)]
    x = np.arange(len(names))
    for k, level in enumerate(("easy", "normal", "hard")):
        right.bar(x + (k - 1) * 0.27, [style[n][level] for n in names], width=0.27, label=level)
    right.set_xticks(x, names, fontsize=7, rotation=15)
    right.axhline(0.5, color="grey", linestyle=":", linewidth=1)
    right.set_ylim(0, 1.05)
    right.set_title("Style bias: a model that prefers fancier style scores easy ≫ hard", fontsize=9)
    right.legend(fontsize=8)
    right.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return png(fig)
