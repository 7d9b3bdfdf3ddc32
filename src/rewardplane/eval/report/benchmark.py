"""The page for a `rewardplane eval --benchmark` directory."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from rewardplane.eval.report.figures import forest_png, style_png
from rewardplane.eval.report.page import Page, add_table, write_page
from rewardplane.eval.report.sections import (
    data_section,
    length_bias_section,
    throughput_section,
    worst_section,
)


def benchmark_report(run: Path, out: Path, summary: dict[str, Any]) -> Path:
    """The page for a `rewardplane eval --benchmark` directory."""
    page = Page()
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
    add_table(page, "Scores (numbers)", ["", "n", "score", "95% interval", "one-sided lower 95%"], table_rows,
               f"Scoring matched: {summary['matched']}.")  # fmt: skip
    ties = summary.get("details", {}).get("ties")
    if ties:
        add_table(page, "Ties terms", ["subset", "score", "ref acc", "tied acc", "preferred", "preferred hard",
                                        "margin"],
                   [[k, *(f"{v[t]:.4f}" for t in ("ties_score", "ref_accuracy", "tied_accuracy", "preferred",
                                                   "preferred_hard", "margin"))] for k, v in ties.items()])  # fmt: skip
    style = summary.get("details", {}).get("style_matrix")
    if style:
        page.add_figure("Style bias (RM-Bench)", "style_bias.png", style_png(style),
                        "Left: P(chosen style i beats rejected style j). Right: easy / normal / hard per domain")  # fmt: skip
    data_section(page, summary.get("data"))
    worst_path = run / summary.get("worst_file", "worst.json")
    worst_section(page, json.loads(worst_path.read_text()) if worst_path.is_file() else [])
    length_bias_section(page, summary["length_bias"], summary["title"])
    throughput_section(page, summary.get("throughput"))
    model = {k: v for k, v in summary["model"].items() if isinstance(v, str | int | float)}
    add_table(page, "Hashes and settings", ["what", "value"], [
        ["data_sha256", summary["data_sha256"]], ["examples_sha256", summary["examples_sha256"]],
        ["headline index_sha256", summary["aggregates"][summary["headline"]["name"]]["bootstrap"]["index_sha256"]],
        ["bootstrap", f"seed {summary['bootstrap']['seed']}, {summary['bootstrap']['replicates']} replicates"],
        ["model", json.dumps(model, sort_keys=True)], ["objective", str(summary["objective"])],
    ])  # fmt: skip
    return write_page(out, f"rewardplane {summary['title']} report: {run.resolve().name}", page)
