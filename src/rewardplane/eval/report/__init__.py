"""`rewardplane report RUN_DIR`: one page a person can read instead of a directory of JSON.

Inputs (each optional; missing parts are stated on the page, not silently dropped):
- RUN/metrics.jsonl — one JSON object per logged step (step, loss, accuracy, tie_rate,
  chosen_mean, rejected_mean, margin_mean, grad_norm, lr, …) → training curves;
- RUN/eval/step-NNNNNNN/summary.json → evaluation accuracy with its 95% interval over steps;
- the latest evaluation's pairs.jsonl → chosen/rejected score histograms and calibration;
- RUN/config.yaml → settings, shown verbatim with its hash;
- RUN/audit.json → the reward service's audit (docs/audit.md): proxy and auditors over policy
  versions with intervals, alarm markers, signature rates. A directory with only audit.json
  gets a page of its own.
A directory written by `rewardplane eval --out DIR` (summary.json + pairs.jsonl at the top) is
also accepted. Output: report.html (PNGs embedded as base64, so the file can be mailed or
attached on its own) and report.md with the same PNGs next to it.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np

from rewardplane.core import legacy
from rewardplane.core.errors import UsageError
from rewardplane.core.hashing import sha256_file
from rewardplane.eval.artifacts import PAIRS_FILE, SUMMARY_FILE, load_summary, read_pairs
from rewardplane.eval.report.audit import AUDIT_FILE, audit_page, audit_section, read_audit
from rewardplane.eval.report.benchmark import benchmark_report
from rewardplane.eval.report.comparison import COMPARISON_FILE, comparison_report
from rewardplane.eval.report.figures import (
    calibration_png,
    calibration_table,
    eval_curve_png,
    expected_calibration_error,
    forest_png,
    histogram_png,
    training_curves_png,
)
from rewardplane.eval.report.page import Page, table, write_page
from rewardplane.eval.report.sections import (
    collect_evals,
    data_section,
    length_bias_section,
    pairs_length_bias,
    read_metrics,
    run_headline,
    subset_forest_rows,
    subset_rows,
    throughput_section,
)

__all__ = ["build_report", "calibration_table", "expected_calibration_error"]

BENCHMARK_SCHEMA = "rewardplane.eval.benchmark/1"


def build_report(run_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write report.html, report.md and the PNGs to out_dir (default RUN/report); return the HTML path."""
    run = Path(run_dir)
    if not run.is_dir():
        raise UsageError(f"{run}: not a directory", code="bad_run_dir")
    out = Path(out_dir) if out_dir is not None else run / "report"
    top = run / SUMMARY_FILE
    if top.is_file():
        raw = json.loads(top.read_text(encoding="utf-8"))
        if raw.get("schema") in (BENCHMARK_SCHEMA, legacy.BENCHMARK_SUMMARY_SCHEMA):
            return benchmark_report(run, out, raw)
    if (run / COMPARISON_FILE).is_file():  # written by `rewardplane compare`
        return comparison_report(run, out)
    audit = run / AUDIT_FILE  # a reward service's audit snapshot (docs/audit.md)
    if audit.is_file() and not (run / "metrics.jsonl").is_file() and not collect_evals(run):
        return audit_page(audit, out)
    if not (run / "metrics.jsonl").is_file() and not collect_evals(run) and not audit.is_file():
        raise UsageError(
            f"{run}: nothing to report (no metrics.jsonl, eval/step-*/summary.json, summary.json,"
            f" {COMPARISON_FILE} or {AUDIT_FILE}): give a training run, or a folder `rewardplane eval`,"
            " `compare` or the audit wrote",
            code="nothing_to_report",
        )
    page = Page()
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

    evals = [(step, path, load_summary(path)) for step, path in collect_evals(run)]
    if not evals:
        page.add("Evaluation", "No evaluation summaries found.", "<p>No evaluation summaries found.</p>")
    else:
        stepped = [(step, summary) for step, _, summary in evals if step is not None]
        if stepped:
            page.add_figure(
                "Evaluation over training", "eval_accuracy.png", eval_curve_png(stepped),
                "Probe accuracy at each evaluation; bars are the 95% percentile-bootstrap interval",
            )  # fmt: skip
        hashes += _latest_evaluation_sections(page, evals)

    if audit.is_file():  # a training run's own service's audit, next to its curves
        audit_section(page, read_audit(audit))

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
        md, html_table = table(["what", "value"], hashes)
        page.add("Hashes", md, html_table)

    return write_page(out, f"rewardplane report: {run.resolve().name}", page)


def _latest_evaluation_sections(page: Page, evals: list) -> list[list[str]]:
    """The latest evaluation's sections (headline, scores, intervals, calibration, per-subset
    results, data, length bias, throughput); returns its hashes for the Hashes table."""
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
    headline = run_headline(evals)
    page.sections.insert(0, ("Headline", headline, f"<p><b>{html.escape(headline)}</b></p>"))
    forest_rows = subset_forest_rows(summary, pairs)
    intervals = {row[0]: (row[2], row[3]) for row in forest_rows[1:]}
    page.add_figure(
        "Accuracy with intervals", "forest.png",
        forest_png(forest_rows, 0.5, f"Strict accuracy by subset ({label}), 95% intervals"),
        "All pairs (red) and each subset, with the percentile-bootstrap interval; dotted line: chance",
    )  # fmt: skip
    calibration = calibration_table(margin)
    page.add_figure(
        "Calibration", "calibration.png", calibration_png(calibration, label),
        "Pairs binned by σ(|margin|); observed = share where the higher-scored response is the chosen one",
    )  # fmt: skip
    md, html_table = table(
        ["subset", "n", "accuracy", "95% interval", "tie-aware", "tie rate", "mean margin", "mean loss"],
        subset_rows(summary, intervals),
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
    data_section(page, summary.get("data"))
    bias = pairs_length_bias(pairs)
    if bias is not None:  # `rewardplane eval` records token lengths; training's evaluations do not
        length_bias_section(page, bias, label)
    throughput_path = path / "throughput.json"
    if throughput_path.is_file():
        throughput_section(page, json.loads(throughput_path.read_text(encoding="utf-8")))
    return [
        ["probe_sha256", summary["probe_sha256"]],
        [f"pairs_sha256 ({label})", summary["pairs_sha256"]],
        ["bootstrap index_sha256", strict["index_sha256"]],
        ["bootstrap means_sha256 (strict)", strict["means_sha256"]],
        ["model", json.dumps(summary["model"], sort_keys=True)],
        ["objective", str(summary["objective"])],
    ]
