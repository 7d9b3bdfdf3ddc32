"""`rewardkit report RUN_DIR`: one page a person can read instead of a directory of JSON.

Inputs (each optional; missing parts are stated on the page, not silently dropped):
- RUN/metrics.jsonl — one JSON object per logged step (step, loss, accuracy, tie_rate,
  chosen_mean, rejected_mean, margin_mean, grad_norm, lr, …) → training curves;
- RUN/eval/step-NNNNNNN/summary.json → evaluation accuracy with its 95% interval over steps;
- the latest evaluation's pairs.jsonl → chosen/rejected score histograms and calibration;
- RUN/config.yaml → settings, shown verbatim with its hash.
A directory written by `rewardkit eval --out DIR` (summary.json + pairs.jsonl at the top) is
also accepted. Output: report.html (PNGs embedded as base64, so the file can be mailed or
attached on its own) and report.md with the same PNGs next to it.
"""

from __future__ import annotations

import base64
import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rewardkit.core import atomic
from rewardkit.core.errors import UsageError
from rewardkit.core.hashing import sha256_file
from rewardkit.eval import metrics
from rewardkit.eval.artifacts import (
    PAIRS_FILE,
    SUMMARY_FILE,
    eval_steps,
    iter_jsonl,
    load_summary,
    read_pairs,
)

CALIBRATION_BINS = 10
_CURVES = (
    ("loss", ("loss",)),
    ("accuracy", ("accuracy", "tie_rate")),
    ("scores", ("margin_mean", "chosen_mean", "rejected_mean")),
    ("grad norm", ("grad_norm",)),
    ("learning rate", ("lr",)),
)


@dataclass
class _Page:
    """Sections in order as (title, markdown body, html body), plus the PNGs the Markdown links to."""

    sections: list[tuple[str, str, str]] = field(default_factory=list)
    figures: dict[str, bytes] = field(default_factory=dict)

    def add(self, title: str, markdown: str, html_body: str) -> None:
        self.sections.append((title, markdown, html_body))

    def add_figure(self, title: str, name: str, png: bytes, caption: str) -> None:
        self.figures[name] = png
        encoded = base64.b64encode(png).decode("ascii")
        self.add(
            title,
            f"![{caption}]({name})\n\n{caption}",
            f'<img alt="{html.escape(caption)}" src="data:image/png;base64,{encoded}">'
            f"<p class=caption>{html.escape(caption)}</p>",
        )


def _png(fig: Any) -> bytes:
    import io

    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Rows of metrics.jsonl that carry a step, in step order; a broken line is refused with its number."""
    rows = [row for _, row in iter_jsonl(path, code="bad_metrics_file")]
    return sorted(
        (r for r in rows if isinstance(r, dict) and isinstance(r.get("step"), int)), key=lambda r: r["step"]
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
    plt = _pyplot()
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
    return _png(fig)


def eval_curve_png(evals: list[tuple[int, dict[str, Any]]]) -> bytes:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    steps = [step for step, _ in evals]
    strict = [summary["bootstrap"]["strict"] for _, summary in evals]
    points = np.array([b["point"] for b in strict])
    low = np.array([b["ci_95"][0] for b in strict])
    high = np.array([b["ci_95"][1] for b in strict])
    ax.errorbar(
        steps, points, yerr=[points - low, high - points], color="C0", marker="o", capsize=4,
        label="accuracy (strict), 95% interval",
    )  # fmt: skip
    tie_aware = [summary["accuracy_tie_aware"] for _, summary in evals]
    ax.plot(
        steps, tie_aware, color="C1", marker="o", markersize=10, fillstyle="none", linestyle="--", zorder=3,
        label="accuracy (tie-aware)",
    )  # fmt: skip
    ax.axhline(0.5, color="grey", linewidth=1, linestyle=":", label="chance (0.5)")
    ax.set_xlabel("training step")
    ax.set_ylabel("probe accuracy")
    ax.set_title(f"Evaluation on the frozen probe (n = {evals[-1][1]['n_pairs']} pairs)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def histogram_png(chosen: np.ndarray, rejected: np.ndarray, step_label: str) -> bytes:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    bins = np.histogram_bin_edges(np.concatenate([chosen, rejected]), bins=40)
    ax.hist(chosen, bins=bins, alpha=0.55, label=f"chosen (mean {chosen.mean():.3f})", color="C2")
    ax.hist(rejected, bins=bins, alpha=0.55, label=f"rejected (mean {rejected.mean():.3f})", color="C3")
    ax.set_xlabel("score")
    ax.set_ylabel("pairs")
    ax.set_title(f"Chosen vs rejected scores ({step_label})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _png(fig)


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
    plt = _pyplot()
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
    return _png(fig)


def _table(headers: list[str], rows: list[list[str]]) -> tuple[str, str]:
    markdown = "| " + " | ".join(headers) + " |\n|" + "---|" * len(headers) + "\n"
    markdown += "".join("| " + " | ".join(r) + " |\n" for r in rows)
    cells = "".join("<th>" + html.escape(h) + "</th>" for h in headers)
    body = "".join("<tr>" + "".join("<td>" + html.escape(c) + "</td>" for c in r) + "</tr>" for r in rows)
    return markdown, f"<table><tr>{cells}</tr>{body}</table>"


def _subset_rows(summary: dict[str, Any]) -> list[list[str]]:
    strict = summary["bootstrap"]["strict"]
    rows = [
        [
            "(all)",
            str(summary["n_pairs"]),
            f"{summary['accuracy']:.4f}",
            f"[{strict['ci_95'][0]:.4f}, {strict['ci_95'][1]:.4f}]",
            f"{summary['accuracy_tie_aware']:.4f}",
            f"{summary['tie_rate']:.4f}",
            f"{summary['margin_mean']:.4f}",
            f"{summary['loss_mean']:.4f}",
        ]
    ]
    for name, s in summary["subsets"].items():
        rows.append(
            [
                name,
                str(s["n_pairs"]),
                f"{s['accuracy']:.4f}",
                "",
                f"{s['accuracy_tie_aware']:.4f}",
                f"{s['tie_rate']:.4f}",
                f"{s['margin_mean']:.4f}",
                f"{s['loss_mean']:.4f}",
            ]
        )
    return rows


def _collect_evals(run: Path) -> list[tuple[int | None, Path]]:
    steps: list[tuple[int | None, Path]] = list(eval_steps(run))
    if not steps and (run / SUMMARY_FILE).is_file():
        steps = [(None, run)]
    return steps


def _render_html(title: str, page: _Page) -> str:
    style = (
        "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
        "table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:right;font-variant-numeric:tabular-nums}th{background:#f3f3f3}td:first-child{text-align:left}"
        "img{max-width:100%}pre{background:#f6f6f6;padding:0.8em;overflow-x:auto}.caption{color:#555}"
    )
    body = "".join(f"<h2>{html.escape(t)}</h2>\n{h}\n" for t, _, h in page.sections)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>\n{body}</body></html>\n"
    )


def build_report(run_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write report.html, report.md and the PNGs to out_dir (default RUN/report); return the HTML path."""
    run = Path(run_dir)
    if not run.is_dir():
        raise UsageError(f"{run}: not a directory", code="bad_run_dir")
    out = Path(out_dir) if out_dir is not None else run / "report"
    page = _Page()
    hashes: list[list[str]] = []

    metrics_path = run / "metrics.jsonl"
    rows = read_metrics(metrics_path) if metrics_path.is_file() else []
    curves = training_curves_png(rows) if rows else None
    if curves is not None:
        page.add_figure(
            "Training curves", "training_curves.png", curves, f"{len(rows)} logged steps from metrics.jsonl"
        )
    else:
        page.add("Training curves", "No metrics.jsonl in this run.", "<p>No metrics.jsonl in this run.</p>")

    evals = [(step, path, load_summary(path)) for step, path in _collect_evals(run)]
    if not evals:
        page.add("Evaluation", "No evaluation summaries found.", "<p>No evaluation summaries found.</p>")
    else:
        stepped = [(step, summary) for step, _, summary in evals if step is not None]
        if stepped:
            page.add_figure(
                "Evaluation over training", "eval_accuracy.png", eval_curve_png(stepped),
                "Probe accuracy at each evaluation; bars are the 95% percentile-bootstrap interval",
            )  # fmt: skip
        step, path, summary = evals[-1]
        label = f"step {step}" if step is not None else path.name
        pairs = read_pairs(path / PAIRS_FILE)
        chosen = np.array([r["chosen_score"] for r in pairs], dtype=np.float64)
        rejected = np.array([r["rejected_score"] for r in pairs], dtype=np.float64)
        margin = np.array([r["margin"] for r in pairs], dtype=np.float64)
        page.add_figure(
            "Scores",
            "score_histogram.png",
            histogram_png(chosen, rejected, label),
            f"Latest evaluation ({label})",
        )
        table = calibration_table(margin)
        page.add_figure(
            "Calibration", "calibration.png", calibration_png(table, label),
            "Pairs binned by σ(|margin|); observed = share where the higher-scored response is the chosen one",
        )  # fmt: skip
        md, html_table = _table(
            ["subset", "n", "accuracy", "95% interval", "tie-aware", "tie rate", "mean margin", "mean loss"],
            _subset_rows(summary),
        )
        strict = summary["bootstrap"]["strict"]
        verdict = (
            f"One-sided 95% lower bound of strict accuracy: {strict['lower_95']:.4f} "
            f"({'above' if strict['pass'] else 'not above'} {strict['pass_threshold']}); "
            f"{strict['replicates']} replicates, seed {strict['seed']}."
        )
        page.add(
            f"Per-subset results ({label})", f"{md}\n{verdict}", f"{html_table}<p>{html.escape(verdict)}</p>"
        )
        hashes += [
            ["probe_sha256", summary["probe_sha256"]],
            [f"pairs_sha256 ({label})", summary["pairs_sha256"]],
            ["bootstrap index_sha256", strict["index_sha256"]],
            ["bootstrap means_sha256 (strict)", strict["means_sha256"]],
            ["model", json.dumps(summary["model"], sort_keys=True)],
            ["objective", str(summary["objective"])],
        ]

    config_path = run / "config.yaml"
    if config_path.is_file():
        text = config_path.read_text(encoding="utf-8")
        page.add(
            "Settings (config.yaml)", f"```yaml\n{text.rstrip()}\n```", f"<pre>{html.escape(text)}</pre>"
        )
        hashes.append(["config.yaml sha256", sha256_file(config_path)])
    else:
        page.add("Settings", "No config.yaml in this run.", "<p>No config.yaml in this run.</p>")
    if hashes:
        md, html_table = _table(["what", "value"], hashes)
        page.add("Hashes", md, html_table)

    title = f"rewardkit report: {run.resolve().name}"
    for name, png in page.figures.items():
        atomic.write_bytes(out / name, png)
    markdown = f"# {title}\n\n" + "".join(f"## {t}\n\n{m}\n\n" for t, m, _ in page.sections)
    atomic.write_text(out / "report.md", markdown)
    atomic.write_text(out / "report.html", _render_html(title, page))
    return out / "report.html"
