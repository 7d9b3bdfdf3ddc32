"""`rewardplane report`: a self-contained HTML page, a Markdown twin, and the calibration numbers."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest

from rewardplane.cli import main
from rewardplane.core.errors import UsageError
from rewardplane.eval.artifacts import eval_step_dir, write_eval_artifacts
from rewardplane.eval.report import build_report, calibration_table, expected_calibration_error

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "metrics.jsonl", "w") as handle:
        for step in range(1, 21):
            row = {
                "step": step,
                "loss": 0.7 - step / 100,
                "accuracy": 0.5 + step / 50,
                "margin_mean": step / 10,
            }
            handle.write(json.dumps({**row, "lr": 1e-4, "grad_norm": 1.0}) + "\n")
    rng = np.random.default_rng(0)
    for step in (0, 20):
        chosen = rng.normal(step / 10, 1, 30)
        write_eval_artifacts(
            eval_step_dir(run, step), pair_ids=[f"p{i}" for i in range(30)], chosen_scores=chosen,
            rejected_scores=np.zeros(30), subsets=["a", "b", "c"] * 10, probe_sha256="ab" * 32,
            objective="reward_model", model_identity={"step": step}, batch_plan={"batch_size": 4}, replicates=100,
        )  # fmt: skip
    (run / "config.yaml").write_text("objective: reward_model\nlr: 1.0e-4\n")
    return run


def test_report_is_self_contained_with_a_markdown_twin(tmp_path, capsys):
    run = _run(tmp_path)
    assert main(["report", str(run)]) == 0
    assert str(run / "report" / "report.html") in capsys.readouterr().out
    page = (run / "report" / "report.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 5  # training curves, eval over steps, histograms, forest plot, calibration
    assert all(base64.b64decode(image).startswith(PNG_MAGIC) for image in images)
    assert not re.search(r'(src|href)="(?!data:)', page)  # nothing outside the file
    markdown = (run / "report" / "report.md").read_text()
    for name in (
        "training_curves.png",
        "eval_accuracy.png",
        "score_histogram.png",
        "forest.png",
        "calibration.png",
    ):
        assert f"]({name})" in markdown
        assert (run / "report" / name).read_bytes().startswith(PNG_MAGIC)
    for text in ("Per-subset results (step 20)", "| a | 10 |", "lr: 1.0e-4", "probe_sha256", "ab" * 32):
        assert text in markdown and text.replace("| a | 10 |", "<td>a</td><td>10</td>") in page


def test_report_of_an_eval_directory_without_training(tmp_path):
    write_eval_artifacts(
        tmp_path / "ev", pair_ids=["x", "y"], chosen_scores=[1.0, 0.0], rejected_scores=[0.0, 1.0],
        subsets=[None, None], probe_sha256="ab" * 32, objective="reward_model", model_identity={},
        batch_plan={}, replicates=50,
    )  # fmt: skip
    path = build_report(tmp_path / "ev", tmp_path / "out")
    page = path.read_text()
    assert "No metrics.jsonl in this run." in page and "No config.yaml in this run." in page
    assert page.count("data:image/png;base64,") == 3  # histograms, forest plot and calibration
    with pytest.raises(UsageError, match="not a directory"):
        build_report(tmp_path / "missing")


def test_calibration_bins_by_hand():
    # σ(|m|): m=0 → 0.5 (tie, credit ½), m=±0.1 → 0.525, m=3 → 0.9526, m=-3 → 0.9526 (wrong)
    margin = np.array([0.0, 0.1, -0.1, 3.0, -3.0, 3.0])
    table = calibration_table(margin, bins=10)
    assert [(row["low"], row["n"]) for row in table] == [(0.5, 3), (0.95, 3)]
    assert table[0]["observed"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert table[1]["observed"] == pytest.approx(2 / 3)
    sig = 1 / (1 + np.exp(-np.array([0.0, 0.1, 3.0])))
    assert table[0]["predicted"] == pytest.approx((sig[0] + 2 * sig[1]) / 3)
    assert table[1]["predicted"] == pytest.approx(sig[2])
    expected = (3 * abs(table[0]["observed"] - table[0]["predicted"]) + 3 * abs(2 / 3 - sig[2])) / 6
    assert expected_calibration_error(table) == pytest.approx(expected)


def test_report_headline_compares_with_step_0(tmp_path):
    run = _run(tmp_path)
    markdown = tmp_path / "run" / "report" / "report.md"
    build_report(run)
    text = markdown.read_text()
    assert text.index("## Headline") < text.index("## Training curves")
    headline = text.split("## Headline\n\n")[1].split("\n")[0]
    assert headline.startswith("Strict accuracy") and "on 30 pairs of the frozen probe at step 20" in headline
    assert "vs step 0" in headline and "paired gain of" in headline
    # a training run's evaluations record no token lengths and no data section: no notice of either
    assert "No token lengths" not in text and "No data section" not in text


def test_report_length_bias_and_data_from_rewardplane_eval_artifacts(tmp_path):
    # chosen longer → right, chosen shorter → wrong: the length panel must show it
    chosen_tokens = [10, 10, 10, 2, 2, 2]
    rejected_tokens = [2, 2, 2, 10, 10, 10]
    write_eval_artifacts(
        tmp_path / "ev", pair_ids=[f"p{i}" for i in range(6)], chosen_scores=[1.0, 1, 1, 0, 0, 0],
        rejected_scores=[0.0, 0, 0, 1, 1, 1], subsets=["a"] * 6, probe_sha256="ab" * 32, objective="reward_model",
        model_identity={}, batch_plan={}, replicates=50, completion_tokens=(chosen_tokens, rejected_tokens),
        extra={"data": {"rows": 8, "valid": 6, "rejected": 2, "rejections": {"identical": 2}, "truncated": 0}},
    )  # fmt: skip
    (tmp_path / "ev" / "throughput.json").write_text(json.dumps({"pairs_per_s": 12.5, "device": "cpu"}))
    build_report(tmp_path / "ev", tmp_path / "out")
    text = (tmp_path / "out" / "report.md").read_text()
    assert "| chosen longer | 3 | 1.0000 |" in text and "| chosen shorter | 3 | 0.0000 |" in text
    assert "Accuracy gap (chosen longer − chosen shorter): 1.000" in text
    assert "|   rejected: identical | 2 |" in text and "| rows read | 8 |" in text
    assert "| pairs per s | 12.50 |" in text
    assert (tmp_path / "out" / "length_bias.png").read_bytes().startswith(PNG_MAGIC)


def _audit_snapshot() -> dict:
    """A service's `GET /v1/audit` body after 10 versions whose auditor ranks every item against
    the proxy (so `decorrelation` fires), produced by the service's own audit stream."""
    import asyncio

    from rewardplane.serve.audit import AuditConfig, AuditStream
    from rewardplane.serve.audit.stream import clean
    from rewardplane.serve.scorers.base import ScoreItem

    class Negated:
        async def score(self, name, items):
            return [-float(len(i.response)) for i in items]

    async def run() -> dict:
        stream = AuditStream(
            AuditConfig(proxy="rm", auditors=["gold"], sample=1.0, min_items=20, batch_wait_s=0), Negated()
        )
        await stream.start()
        for v in range(10):
            items = [
                ScoreItem(str(i), "p", "x" * (i % 9 + 1), metadata={"policy_version": v}) for i in range(30)
            ]
            stream.observe(["rm"], items, {"rm": [float(i % 9 + 1) for i in range(30)]})
            await stream.drain()
        await stream.stop()
        return clean(stream._snapshot(summary=False, since=None))

    return asyncio.run(run())


def test_audit_snapshot_gets_a_page_of_its_own_and_a_section_in_a_run(tmp_path):
    body = _audit_snapshot()
    alone = tmp_path / "service"
    alone.mkdir()
    (alone / "audit.json").write_text(json.dumps(body))
    page = build_report(alone).read_text()
    assert "<h2>Audit</h2>" in page and "decorrelation" in page and "first at version 2" in page
    assert len(re.findall(r'src="data:image/png;base64,([^"]+)"', page)) == 1
    assert (alone / "report" / "audit.png").read_bytes().startswith(PNG_MAGIC)
    run = _run(tmp_path)
    (run / "audit.json").write_text(json.dumps(body))
    page = build_report(run).read_text()
    assert "<h2>Training curves</h2>" in page and "<h2>Audit over versions</h2>" in page


def test_a_file_that_is_not_an_audit_snapshot_is_refused(tmp_path):
    (tmp_path / "audit.json").write_text(json.dumps({"schema": "something/else"}))
    with pytest.raises(UsageError, match="not an audit snapshot"):
        build_report(tmp_path)
