"""Sections shared by the run page and the benchmark page: data, throughput, length bias,
worst pairs, per-subset tables, and the run's headline sentence."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import numpy as np

from rewardplane.core.errors import UsageError
from rewardplane.eval import bootstrap
from rewardplane.eval.artifacts import PAIRS_FILE, SUMMARY_FILE, eval_steps, iter_jsonl
from rewardplane.eval.report.figures import length_bias_png
from rewardplane.eval.report.page import Page, add_table, fmt


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Rows of metrics.jsonl that carry a step, in step order; a broken line is refused with its number."""
    rows = [row for _, row in iter_jsonl(path, code="bad_metrics_file")]
    return sorted(
        (r for r in rows if isinstance(r, dict) and isinstance(r.get("step"), int)), key=lambda r: r["step"]
    )


def subset_rows(
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


def collect_evals(run: Path) -> list[tuple[int | None, Path]]:
    steps: list[tuple[int | None, Path]] = list(eval_steps(run))
    if not steps and (run / SUMMARY_FILE).is_file():
        steps = [(None, run)]
    return steps


def data_section(page: Page, data: dict[str, Any] | None) -> None:
    """The data counts of an evaluation; nothing when its summary has none (a training run's
    evaluations count their data in the run's manifest, not here)."""
    if not data:
        return
    rows = [["rows read", fmt(data.get("rows"))], ["scored", fmt(data.get("valid"))],
            ["rejected", fmt(data.get("rejected"))]]  # fmt: skip
    rows += [
        [f"  rejected: {reason}", str(n)] for reason, n in sorted((data.get("rejections") or {}).items())
    ]
    for key, label in (("truncated_examples", "examples with a truncated text"),
                       ("truncated_texts", "truncated texts"), ("truncated", "truncated pairs"),
                       ("distinct_texts", "distinct texts scored"), ("truncation", "truncation policy"),
                       ("max_length", "max length (tokens)")):  # fmt: skip
        if key in data:
            rows.append([label, fmt(data[key]) if data[key] is not None else "not counted (truncate policy)"])
    add_table(page, "Data", ["what", "count"], rows)


def throughput_section(page: Page, throughput: dict[str, Any] | None) -> None:
    if not throughput:
        return
    rows = [[key.replace("_", " "), fmt(value, 2)] for key, value in throughput.items()]
    add_table(
        page, "Throughput", ["what", "value"], rows, "Scoring only (model forward passes), not loading."
    )


def length_bias_section(page: Page, bias: dict[str, Any], label: str) -> None:
    page.add_figure(
        "Length bias", "length_bias.png", length_bias_png(bias, label),
        "Accuracy of chosen-vs-rejected comparisons when the chosen response is longer vs shorter; "
        "a large gap means the score tracks length",
    )  # fmt: skip
    rows = [
        [k.replace("_", " "), str(bias[k]["comparisons"]), fmt(bias[k]["accuracy"])]
        for k in ("chosen_longer", "same_length", "chosen_shorter")
    ]
    note = (
        f"Accuracy gap (chosen longer − chosen shorter): {fmt(bias.get('gap'), 3)}; correlation of score with "
        f"length over all scored responses: Pearson {fmt(bias.get('pearson_score_length'), 3)}, "
        f"Spearman {fmt(bias.get('spearman_score_length'), 3)}."
    )
    add_table(page, "Length bias (numbers)", ["comparison", "n", "accuracy"], rows, note)


def worst_section(page: Page, worst: list[dict[str, Any]]) -> None:
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


def pairs_length_bias(pairs: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not pairs or "chosen_tokens" not in pairs[0]:
        return None
    from rewardplane.eval.benchmarks.common import length_bias

    return length_bias(
        [[r["chosen_score"]] for r in pairs], [[r["rejected_score"]] for r in pairs],
        [[r["chosen_tokens"]] for r in pairs], [[r["rejected_tokens"]] for r in pairs], "completion tokens",
    )  # fmt: skip


def subset_forest_rows(summary: dict[str, Any], pairs: list[dict[str, Any]]) -> list[tuple]:
    strict = summary["bootstrap"]["strict"]
    rows = [("(all)", strict["point"], strict["ci_95"][0], strict["ci_95"][1], summary["n_pairs"])]
    for name in summary["subsets"]:
        values = np.array([float(r["correct"]) for r in pairs if r["subset"] == name])
        block = bootstrap.bootstrap_mean(
            values, statistic=f"{name}: accuracy", seed=strict["seed"], replicates=strict["replicates"]
        )
        rows.append((name, block["point"], block["ci_95"][0], block["ci_95"][1], values.size))
    return rows


def run_headline(evals: list[tuple[int | None, Path, dict[str, Any]]]) -> str:
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
