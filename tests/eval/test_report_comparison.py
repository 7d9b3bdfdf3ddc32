"""`rewardplane report` on what `compare` wrote renders the comparison, and on a folder with nothing
to report refuses in one line (issue 47: it wrote an empty page); the report's figures do not draw
what was not measured (two evaluations are two points) and no legend covers a bar."""

from __future__ import annotations

import json

import numpy as np

from rewardplane.cli import main
from rewardplane.eval.artifacts import write_eval_artifacts
from rewardplane.eval.report import figures


def _eval(folder, chosen):
    write_eval_artifacts(
        folder, pair_ids=[f"p{i}" for i in range(12)], chosen_scores=chosen, rejected_scores=np.zeros(12),
        subsets=["a", "b"] * 6, probe_sha256="ab" * 32, objective="reward_model", model_identity={},
        batch_plan={}, replicates=100,
    )  # fmt: skip


def test_report_of_a_compare_folder_shows_the_comparison(tmp_path, capsys):
    _eval(tmp_path / "A", np.array([1.0, -1.0] * 6))  # half right
    _eval(tmp_path / "B", np.array([1.0] * 10 + [-1.0] * 2))  # 10 of 12 right
    argv = ["compare", str(tmp_path / "A" / "pairs.jsonl"), str(tmp_path / "B" / "pairs.jsonl")]
    assert main([*argv, "--out", str(tmp_path / "AB"), "--replicates", "200"]) == 0
    comparison = json.loads((tmp_path / "AB" / "comparison.json").read_text())
    capsys.readouterr()
    assert main(["report", str(tmp_path / "AB")]) == 0
    markdown = (tmp_path / "AB" / "report" / "report.md").read_text()
    page = (tmp_path / "AB" / "report" / "report.html").read_text()
    block = comparison["bootstrap"]["strict"]
    low, high = block["ci_95"]
    for text in (
        f"B − A = {comparison['difference']:+.4f}",
        f"95% interval {low:+.4f} to {high:+.4f}",
        f"P(B > A) = {block['p_b_greater']:.3f}",
        f"McNemar p = {comparison['mcnemar_p']:.4g}",
        "| a | 6 |",
        "| b | 6 |",
        "Training overlap",  # neither model records its training pairs: said, as compare says it
    ):
        assert text in markdown, text
    assert "record" in markdown.split("## Training overlap")[1]
    assert page.count("data:image/png;base64,") == 1 and "No metrics.jsonl" not in markdown


def test_report_of_a_folder_with_nothing_to_report_refuses_in_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nothing to report" in err
    assert not (tmp_path / "empty" / "report").exists()


def _figure(monkeypatch):
    drawn = []
    monkeypatch.setattr(figures, "png", lambda fig: drawn.append(fig) or b"")
    return drawn


def _summary(step, point):
    block = {"point": point, "ci_95": [point - 0.1, point + 0.1]}
    return step, {"bootstrap": {"strict": block}, "accuracy_tie_aware": point, "n_pairs": 20}


def test_two_evaluations_are_two_points_not_a_line(monkeypatch):
    """run.eval_every: 0 evaluates at step 0 and the last step: nothing was measured between."""
    drawn = _figure(monkeypatch)
    figures.eval_curve_png([_summary(0, 0.5), _summary(400, 0.8)])
    figures.eval_curve_png([_summary(0, 0.5), _summary(200, 0.7), _summary(400, 0.8)])
    two, three = ([line.get_linestyle() for line in fig.axes[0].lines] for fig in drawn)
    assert set(two) - {":"} == {"None"} and "-" in three  # ":" is the chance line


def test_the_forest_plot_has_no_legend_to_cover_a_bar(monkeypatch):
    drawn = _figure(monkeypatch)
    rows = [("(all)", 0.9, 0.8, 1.0, 40), ("a", 0.95, 0.9, 1.0, 20), ("b", 0.85, 0.7, 1.0, 20)]
    figures.forest_png(rows, 0.5, "t")
    (ax,) = drawn[0].axes
    assert ax.get_legend() is None and "chance (0.5)" in ax.get_xlabel()


def _audit_body(n_bins: int) -> dict:
    bins = [
        {"versions": [2 * k, 2 * k + 1], "n": 100, "proxy": {"mean": 0.1 * k}, "length": {"mean": 10.0},
         "auditors": {"gold": {"mean": 0.5, "tau": None, "gap": None}}, "signatures": {}}
        for k in range(n_bins)
    ]  # fmt: skip
    return {
        "proxy": "rm", "auditors": ["gold"], "bins": bins, "alarms": {}, "counts": {"audited": 100 * n_bins},
        "settings": {"alarms": {"overoptimization": {"enabled": True, "window": 3}}},
    }  # fmt: skip


def test_the_audit_page_says_why_overoptimization_is_not_there_yet_and_ticks_whole_versions(monkeypatch):
    from rewardplane.eval.report.audit import audit_section
    from rewardplane.eval.report.page import Page

    drawn = _figure(monkeypatch)
    monkeypatch.setattr("rewardplane.eval.report.audit.png", lambda fig: drawn.append(fig) or b"")
    page = Page()
    audit_section(page, _audit_body(2))
    text = " ".join(markdown for _, markdown, _ in page.sections)
    assert "overoptimization has no row yet" in text and "decided from bin 6 on (this audit has 2)" in text
    ticks = drawn[0].axes[-1].get_xticks()
    assert len(ticks) and all(float(t).is_integer() for t in ticks)
    page = Page()
    audit_section(page, _audit_body(6))  # enough bins: nothing to explain
    assert "no row yet" not in " ".join(markdown for _, markdown, _ in page.sections)
