"""`rewardplane report RUN_DIR`: one page a person can read instead of a directory of JSON.

Inputs (each optional; missing parts are stated on the page, not silently dropped):
- RUN/metrics.jsonl — one JSON object per logged step (step, loss, accuracy, tie_rate,
  chosen_mean, rejected_mean, margin_mean, grad_norm, lr, …) → training curves;
- RUN/eval/step-NNNNNNN/summary.json → evaluation accuracy with its 95% interval over steps;
- the latest evaluation's pairs.jsonl → chosen/rejected score histograms and calibration;
- RUN/config.yaml → settings, shown verbatim with its hash.
A directory written by `rewardplane eval --out DIR` (summary.json + pairs.jsonl at the top) is
also accepted. Output: report.html (PNGs embedded as base64, so the file can be mailed or
attached on its own) and report.md with the same PNGs next to it.
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rewardplane.core import atomic, legacy
from rewardplane.core.errors import UsageError
from rewardplane.core.hashing import sha256_file
from rewardplane.eval import bootstrap, metrics
from rewardplane.eval.artifacts import (
    PAIRS_FILE,
    SUMMARY_FILE,
    eval_steps,
    iter_jsonl,
    load_summary,
    read_pairs,
)
from rewardplane.eval.figures import (
    calibration_png,
    eval_curve_png,
    forest_png,
    histogram_png,
    length_bias_png,
    style_png,
    training_curves_png,
)

CALIBRATION_BINS = 10
BENCHMARK_SCHEMA = "rewardplane.eval.benchmark/1"


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


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Rows of metrics.jsonl that carry a step, in step order; a broken line is refused with its number."""
    rows = [row for _, row in iter_jsonl(path, code="bad_metrics_file")]
    return sorted(
        (r for r in rows if isinstance(r, dict) and isinstance(r.get("step"), int)), key=lambda r: r["step"]
    )


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


def _table(headers: list[str], rows: list[list[str]]) -> tuple[str, str]:
    markdown = "| " + " | ".join(headers) + " |\n|" + "---|" * len(headers) + "\n"
    markdown += "".join("| " + " | ".join(r) + " |\n" for r in rows)
    cells = "".join("<th>" + html.escape(h) + "</th>" for h in headers)
    body = "".join("<tr>" + "".join("<td>" + html.escape(c) + "</td>" for c in r) + "</tr>" for r in rows)
    return markdown, f"<table><tr>{cells}</tr>{body}</table>"


def _subset_rows(
    summary: dict[str, Any], intervals: dict[str, tuple[float, float]] | None = None
) -> list[list[str]]:
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
                f"[{intervals[name][0]:.4f}, {intervals[name][1]:.4f}]"
                if intervals and name in intervals
                else "",
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


# ---- headline, forest plot, data, worst pairs, length and style bias, throughput -----------------


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _add_table(page: _Page, title: str, headers: list[str], rows: list[list[str]], note: str = "") -> None:
    md, html_table = _table(headers, rows)
    page.add(
        title,
        md + (f"\n{note}" if note else ""),
        html_table + (f"<p>{html.escape(note)}</p>" if note else ""),
    )


def _data_section(page: _Page, data: dict[str, Any] | None) -> None:
    if not data:
        page.add("Data", "No data section in this summary.", "<p>No data section in this summary.</p>")
        return
    rows = [["rows read", _fmt(data.get("rows"))], ["scored", _fmt(data.get("valid"))],
            ["rejected", _fmt(data.get("rejected"))]]  # fmt: skip
    rows += [
        [f"  rejected: {reason}", str(n)] for reason, n in sorted((data.get("rejections") or {}).items())
    ]
    for key, label in (("truncated_examples", "examples with a truncated text"),
                       ("truncated_texts", "truncated texts"), ("truncated", "truncated pairs"),
                       ("distinct_texts", "distinct texts scored"), ("truncation", "truncation policy"),
                       ("max_length", "max length (tokens)")):  # fmt: skip
        if key in data:
            rows.append(
                [label, _fmt(data[key]) if data[key] is not None else "not counted (truncate policy)"]
            )
    _add_table(page, "Data", ["what", "count"], rows)


def _throughput_section(page: _Page, throughput: dict[str, Any] | None) -> None:
    if not throughput:
        return
    rows = [[key.replace("_", " "), _fmt(value, 2)] for key, value in throughput.items()]
    _add_table(
        page, "Throughput", ["what", "value"], rows, "Scoring only (model forward passes), not loading."
    )


def _length_bias_section(page: _Page, bias: dict[str, Any], label: str) -> None:
    page.add_figure(
        "Length bias", "length_bias.png", length_bias_png(bias, label),
        "Accuracy of chosen-vs-rejected comparisons when the chosen response is longer vs shorter; "
        "a large gap means the score tracks length",
    )  # fmt: skip
    rows = [
        [k.replace("_", " "), str(bias[k]["comparisons"]), _fmt(bias[k]["accuracy"])]
        for k in ("chosen_longer", "same_length", "chosen_shorter")
    ]
    note = (
        f"Accuracy gap (chosen longer − chosen shorter): {_fmt(bias.get('gap'), 3)}; correlation of score with "
        f"length over all scored responses: Pearson {_fmt(bias.get('pearson_score_length'), 3)}, "
        f"Spearman {_fmt(bias.get('spearman_score_length'), 3)}."
    )
    _add_table(page, "Length bias (numbers)", ["comparison", "n", "accuracy"], rows, note)


def _worst_section(page: _Page, worst: list[dict[str, Any]]) -> None:
    if not worst:
        page.add("Worst pairs", "No wrong examples.", "<p>No wrong examples.</p>")
        return

    def cut(text: str, n: int = 300) -> str:
        text = " ".join(str(text).split())
        return text if len(text) <= n else text[:n] + " …"

    def cell(value: Any) -> str:
        return cut(str(value)).replace("|", "\\|")

    md_rows = "".join(
        f"| {cell(w['id'])} | {cell(w['subset'])} | {w['wrong_margin']:.3f} | {cell(w['prompt'])} | "
        f"{cell(w['chosen'])} | {cell(w['rejected'])} |\n"
        for w in worst
    )
    markdown = (
        "| id | subset | wrong margin | prompt | chosen | rejected |\n|---|---|---|---|---|---|\n" + md_rows
    )
    body = "".join(
        f"<tr><td>{html.escape(str(w['id']))}</td><td>{html.escape(str(w['subset']))}</td>"
        f"<td>{w['wrong_margin']:.3f}</td>"
        + "".join(
            f'<td style="text-align:left;max-width:22em;white-space:pre-wrap">{html.escape(cut(w[k], 600))}</td>'
            for k in ("prompt", "chosen", "rejected")
        )
        + "</tr>"
        for w in worst
    )
    table = (
        "<table><tr><th>id</th><th>subset</th><th>wrong margin</th><th>prompt</th><th>chosen</th>"
        f"<th>rejected</th></tr>{body}</table>"
    )
    note = "Largest wrong margins: best rejected score − worst chosen score, among the examples scored wrong."
    page.add("Worst pairs", f"{markdown}\n{note}", f"{table}<p>{html.escape(note)}</p>")


def _pairs_length_bias(pairs: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not pairs or "chosen_tokens" not in pairs[0]:
        return None
    from rewardplane.eval.benchmarks.common import length_bias

    return length_bias(
        [[r["chosen_score"]] for r in pairs], [[r["rejected_score"]] for r in pairs],
        [[r["chosen_tokens"]] for r in pairs], [[r["rejected_tokens"]] for r in pairs], "completion tokens",
    )  # fmt: skip


def _subset_forest_rows(summary: dict[str, Any], pairs: list[dict[str, Any]]) -> list[tuple]:
    strict = summary["bootstrap"]["strict"]
    rows = [("(all)", strict["point"], strict["ci_95"][0], strict["ci_95"][1], summary["n_pairs"])]
    for name in summary["subsets"]:
        values = np.array([float(r["correct"]) for r in pairs if r["subset"] == name])
        block = bootstrap.bootstrap_mean(
            values, statistic=f"{name}: accuracy", seed=strict["seed"], replicates=strict["replicates"]
        )
        rows.append((name, block["point"], block["ci_95"][0], block["ci_95"][1], values.size))
    return rows


def _run_headline(evals: list[tuple[int | None, Path, dict[str, Any]]]) -> str:
    step, path, summary = evals[-1]
    strict = summary["bootstrap"]["strict"]
    where = f"at step {step}" if step is not None else f"in {path.name}"
    sentence = (
        f"Strict accuracy {strict['point']:.3f} (95% interval {strict['ci_95'][0]:.3f}–{strict['ci_95'][1]:.3f}; "
        f"one-sided lower bound {strict['lower_95']:.3f}) on {summary['n_pairs']} pairs of the frozen probe {where}, "
        f"{'above' if strict['pass'] else 'not shown above'} chance (0.5)"
    )
    first_step, first_path, first = evals[0]
    if len(evals) > 1 and first_step is not None and first_step != step:
        from rewardplane.eval.compare import compare_pairs

        try:
            diff = compare_pairs(first_path / PAIRS_FILE, path / PAIRS_FILE, seed=strict["seed"],
                                 replicates=strict["replicates"])["bootstrap"]["strict"]  # fmt: skip
            sentence += (
                f"; vs step {first_step} ({first['accuracy']:.3f}) a paired gain of {diff['point']:+.3f} "
                f"(95% interval {diff['ci_95'][0]:+.3f} to {diff['ci_95'][1]:+.3f})"
            )
        except UsageError:
            pass
    return sentence + "."


def _benchmark_report(run: Path, out: Path, summary: dict[str, Any]) -> Path:
    """The page for a `rewardplane eval --benchmark` directory."""
    page = _Page()
    page.add(
        "Headline",
        summary["headline"]["sentence"],
        f"<p><b>{html.escape(summary['headline']['sentence'])}</b></p>",
    )
    chance = summary["chance"]
    rows = [
        (name, e["score"], e["bootstrap"]["ci_95"][0], e["bootstrap"]["ci_95"][1], e["n"])
        for name, e in summary["aggregates"].items()
    ]
    rows += [
        (f"  {name}", e["value"], e["bootstrap"]["ci_95"][0], e["bootstrap"]["ci_95"][1], e["n"])
        for name, e in summary["subsets"].items()
    ]
    page.add_figure(
        "Scores with intervals", "forest.png", forest_png(rows, chance, f"{summary['title']}: every number, 95% intervals"),
        "Aggregates first (headline in red), then each subset; dotted line: chance",
    )  # fmt: skip
    table_rows = [
        [name, str(e["n"]), f"{e['score']:.4f}", f"[{e['bootstrap']['ci_95'][0]:.4f}, {e['bootstrap']['ci_95'][1]:.4f}]",
         f"{e['bootstrap']['lower_95']:.4f}"]
        for name, e in summary["aggregates"].items()
    ] + [
        [f"  {name}", str(e["n"]), f"{e['value']:.4f}", f"[{e['bootstrap']['ci_95'][0]:.4f}, {e['bootstrap']['ci_95'][1]:.4f}]",
         f"{e['bootstrap']['lower_95']:.4f}"]
        for name, e in summary["subsets"].items()
    ]  # fmt: skip
    _add_table(page, "Scores (numbers)", ["", "n", "score", "95% interval", "one-sided lower 95%"], table_rows,
               f"Scoring matched: {summary['matched']}.")  # fmt: skip
    ties = summary.get("details", {}).get("ties")
    if ties:
        _add_table(page, "Ties terms", ["subset", "score", "ref acc", "tied acc", "preferred", "preferred hard",
                                        "margin"],
                   [[k, *(f"{v[t]:.4f}" for t in ("ties_score", "ref_accuracy", "tied_accuracy", "preferred",
                                                   "preferred_hard", "margin"))] for k, v in ties.items()])  # fmt: skip
    style = summary.get("details", {}).get("style_matrix")
    if style:
        page.add_figure("Style bias (RM-Bench)", "style_bias.png", style_png(style),
                        "Left: P(chosen style i beats rejected style j). Right: easy / normal / hard per domain")  # fmt: skip
    _data_section(page, summary.get("data"))
    worst_path = run / summary.get("worst_file", "worst.json")
    _worst_section(page, json.loads(worst_path.read_text()) if worst_path.is_file() else [])
    _length_bias_section(page, summary["length_bias"], summary["title"])
    _throughput_section(page, summary.get("throughput"))
    model = {k: v for k, v in summary["model"].items() if isinstance(v, str | int | float)}
    _add_table(page, "Hashes and settings", ["what", "value"], [
        ["data_sha256", summary["data_sha256"]], ["examples_sha256", summary["examples_sha256"]],
        ["headline index_sha256", summary["aggregates"][summary["headline"]["name"]]["bootstrap"]["index_sha256"]],
        ["bootstrap", f"seed {summary['bootstrap']['seed']}, {summary['bootstrap']['replicates']} replicates"],
        ["model", json.dumps(model, sort_keys=True)], ["objective", str(summary["objective"])],
    ])  # fmt: skip
    return _write_page(out, f"rewardplane {summary['title']} report: {run.resolve().name}", page)


def _write_page(out: Path, title: str, page: _Page) -> Path:
    for name, png in page.figures.items():
        atomic.write_bytes(out / name, png)
    markdown = f"# {title}\n\n" + "".join(f"## {t}\n\n{m}\n\n" for t, m, _ in page.sections)
    atomic.write_text(out / "report.md", markdown)
    atomic.write_text(out / "report.html", _render_html(title, page))
    return out / "report.html"


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
            return _benchmark_report(run, out, raw)
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
        headline = _run_headline(evals)
        page.sections.insert(0, ("Headline", headline, f"<p><b>{html.escape(headline)}</b></p>"))
        forest_rows = _subset_forest_rows(summary, pairs)
        intervals = {row[0]: (row[2], row[3]) for row in forest_rows[1:]}
        page.add_figure(
            "Accuracy with intervals", "forest.png",
            forest_png(forest_rows, 0.5, f"Strict accuracy by subset ({label}), 95% intervals"),
            "All pairs (red) and each subset, with the percentile-bootstrap interval; dotted line: chance",
        )  # fmt: skip
        table = calibration_table(margin)
        page.add_figure(
            "Calibration", "calibration.png", calibration_png(table, label, expected_calibration_error(table)),
            "Pairs binned by σ(|margin|); observed = share where the higher-scored response is the chosen one",
        )  # fmt: skip
        md, html_table = _table(
            ["subset", "n", "accuracy", "95% interval", "tie-aware", "tie rate", "mean margin", "mean loss"],
            _subset_rows(summary, intervals),
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
        _data_section(page, summary.get("data"))
        bias = _pairs_length_bias(pairs)
        if bias is not None:
            _length_bias_section(page, bias, label)
        else:
            page.add("Length bias", "No token lengths in pairs.jsonl (written by `rewardplane eval`).",
                     "<p>No token lengths in pairs.jsonl (written by <code>rewardplane eval</code>).</p>")  # fmt: skip
        throughput_path = path / "throughput.json"
        if throughput_path.is_file():
            _throughput_section(page, json.loads(throughput_path.read_text(encoding="utf-8")))
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

    return _write_page(out, f"rewardplane report: {run.resolve().name}", page)
