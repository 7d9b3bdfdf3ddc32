"""Artifacts written by rewardkit (before the rename to rewardplane) load and score as before.

`tests/fixtures/legacy_rewardkit/` was written by rewardkit 0.1.0 at 1cf1c40, the last commit
before the rename: a Llama-shaped checkpoint (`rewardkit.json`), a BERT-shaped one (its
config.json masks `model_type` as `rewardkit-bert` / `rewardkit_model_type`), an HF export
(`rewardkit_export.json`), a frozen probe (`rewardkit.probe/v1`) and the evaluation file. Its
`expected_scores.json` holds the chosen / rejected score of every pair as rewardkit's own
`rewardkit eval` wrote them; the rename must not move a single one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rewardplane.cli import main
from rewardplane.core import legacy

torch.set_num_threads(1)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "legacy_rewardkit"
EXPECTED = json.loads((FIXTURES / "expected_scores.json").read_text())["scores"]
TOL = 1e-6


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    """The fixture folder copied, so that nothing a load might write lands in the repository."""
    root = tmp_path_factory.mktemp("legacy")
    shutil.copytree(FIXTURES, root / "fx")
    return root / "fx"


def test_fixtures_use_the_old_names_only(copies):
    """The fixtures are what rewardkit wrote: a new-name file beside them would test nothing."""
    for name in ("checkpoint_llama", "checkpoint_bert"):
        assert (copies / name / legacy.CHECKPOINT_METADATA).is_file()
        assert not (copies / name / "rewardplane.json").exists()
    assert (copies / "export_llama" / legacy.EXPORT_RECORD).is_file()
    bert = json.loads((copies / "checkpoint_bert" / "config.json").read_text())
    assert bert["model_type"] == legacy.MASKED_MODEL_TYPE_PREFIX + "bert"
    assert legacy.MASKED_MODEL_TYPE_KEY in bert
    assert json.loads((copies / "probe.json").read_text())["format"] == legacy.PROBE_FORMAT


@pytest.mark.parametrize("name", ["checkpoint_llama", "checkpoint_bert", "export_llama"])
def test_old_artifacts_evaluate_on_the_old_probe_to_the_same_scores(copies, tmp_path, name):
    out = tmp_path / "ev"
    args = ["eval", "--model", str(copies / name), "--probe", str(copies / "probe.json")]
    assert main([*args, "--data", str(copies / "eval.jsonl"), "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]
    expected = EXPECTED[name]
    assert len(rows) == len(expected) == 40
    for row in rows:
        chosen, rejected = expected[row["pair_id"]]
        assert row["chosen_score"] == pytest.approx(chosen, abs=TOL)
        assert row["rejected_score"] == pytest.approx(rejected, abs=TOL)


@pytest.mark.parametrize("name", ["checkpoint_llama", "export_llama"])
def test_old_artifacts_serve_the_scores_rewardkit_evaluated(copies, name):
    """The `rm` scorer reads the old metadata too (plain_text, score position) and scores each
    plain-text pair's chosen response as rewardkit's eval did."""
    from rewardplane.serve.protocol import ScoreItem
    from rewardplane.serve.scorers.registry import ScorerSpec, build_scorer

    scorer = build_scorer(ScorerSpec(name="rm", kind="rm", path=str(copies / name), device="cpu"))
    scorer.load()
    rows = [json.loads(line) for line in (copies / "eval.jsonl").read_text().splitlines()]
    rows = [r for r in rows if isinstance(r["prompt"], str) and isinstance(r["chosen"], str)][:8]
    assert rows
    items = [ScoreItem(r["pair_id"], r["prompt"], r["chosen"]) for r in rows]
    scores = scorer.score_prepared(scorer.prepare_many(items))
    for row, score in zip(rows, scores, strict=True):
        assert score == pytest.approx(EXPECTED[name][row["pair_id"]][0], abs=TOL)


def test_an_old_checkpoint_is_listed_and_resumable_by_its_metadata(copies, tmp_path):
    from rewardplane.train.checkpoint import latest_checkpoint

    run = tmp_path / "checkpoints"
    shutil.copytree(copies / "checkpoint_llama", run / "step-0000006")
    assert latest_checkpoint(run) == run / "step-0000006"
