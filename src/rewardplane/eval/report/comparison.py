"""`rewardplane report` on a folder written by `rewardplane compare`: the comparison.json page.

The page says what `compare` printed, with the paired intervals drawn: B − A with its 95%
interval, P(B > A), the exact McNemar p and the discordant counts for all pairs (or each
benchmark aggregate) and every subset, and the training-overlap warnings of either model.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from rewardplane.core.errors import UsageError
from rewardplane.data.overlap import is_clean, overlap_line
from rewardplane.eval.report.figures import forest_png
from rewardplane.eval.report.page import Page, table, write_page

COMPARISON_FILE = "comparison.json"
HEADERS = ["", "n", "A", "B", "B − A", "95% interval", "P(B>A)", "A only", "B only", "McNemar p"]


def _entries(comparison: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(label, entry, its bootstrap block): the headline rows first, then each subset."""
    if "aggregates" in comparison:  # a benchmark comparison
        head = [(name, e, e["bootstrap"]) for name, e in comparison["aggregates"].items()]
    else:
        head = [("(all pairs)", comparison, comparison["bootstrap"]["strict"])]
    return head + [(name, e, e["bootstrap"]) for name, e in comparison["subsets"].items()]


def _row(label: str, entry: dict[str, Any], block: dict[str, Any]) -> list[str]:
    low, high = block["ci_95"]
    return [
        label, str(entry["n_pairs"]), f"{entry['accuracy_a']:.4f}", f"{entry['accuracy_b']:.4f}",
        f"{entry['difference']:+.4f}", f"[{low:+.4f}, {high:+.4f}]", f"{block['p_b_greater']:.4f}",
        str(entry["discordant_a_only"]), str(entry["discordant_b_only"]), f"{entry['mcnemar_p']:.4g}",
    ]  # fmt: skip


def headline(label: str, entry: dict[str, Any], block: dict[str, Any]) -> str:
    low, high = block["ci_95"]
    side = "B above A" if low > 0 else "A above B" if high < 0 else "no difference shown"
    return (
        f"{label}: B − A = {entry['difference']:+.4f} (95% interval {low:+.4f} to {high:+.4f}: {side}); "
        f"P(B > A) = {block['p_b_greater']:.3f} over {block['replicates']} paired replicates; exact McNemar "
        f"p = {entry['mcnemar_p']:.4g} ({entry['discordant_a_only']} pairs only A got right, "
        f"{entry['discordant_b_only']} only B) on {entry['n_pairs']} pairs"
    )


def comparison_report(folder: Path, out: Path) -> Path:
    """Write the comparison page of `folder`/comparison.json to `out`; return the HTML path."""
    try:
        comparison = json.loads((folder / COMPARISON_FILE).read_text(encoding="utf-8"))
        entries = _entries(comparison)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(
            f"{folder / COMPARISON_FILE}: not a comparison rewardplane compare wrote ({exc})"
        ) from None
    page = Page()
    sentence = headline(*entries[0])
    page.add("Headline", sentence, f"<p><b>{html.escape(sentence)}</b></p>")
    sources = f"A: {comparison['a']}; B: {comparison['b']}"
    page.add("What was compared", sources, f"<p>{html.escape(sources)}</p>")
    warnings = [
        overlap_line(entry, f"model {side.upper()}")
        for side, entry in comparison.get("train_overlap", {}).items()
        if entry is not None and not is_clean(entry)
    ]
    if warnings:
        text = "Warning: " + " ".join(warnings)
        page.add("Training overlap", text, f"<p><b>{html.escape(text)}</b></p>")
    md, html_table = table(HEADERS, [_row(*e) for e in entries])
    page.add("Differences", md, html_table)
    rows = [(label, e["difference"], b["ci_95"][0], b["ci_95"][1], e["n_pairs"]) for label, e, b in entries]
    page.add_figure(
        "Differences with intervals", "forest.png",
        forest_png(rows, 0.0, "B − A with paired 95% intervals", reference="no difference"),
        "Each row: the difference B − A and its paired percentile-bootstrap interval",
    )  # fmt: skip
    return write_page(out, f"rewardplane report: {folder.resolve().name} (B vs A)", page)
