"""`rewardplane eval` on a DPO policy: implicit rewards against the verified reference."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rewardplane.cli import main
from rewardplane.data.probe import freeze_probe
from rewardplane.data.synth import builtin_tokenizer, generate_rows
from rewardplane.data.tokenize import TokenizeSettings
from rewardplane.eval.artifacts import eval_step_dir, read_pairs
from rewardplane.eval.runner import tokenize_eval_data

TRAIN_ROWS, EVAL_ROWS, STEPS = 32, 16, 2
SETTINGS = TokenizeSettings(max_length=96, max_completion_length=48)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny base causal LM, a DPO run started from it, and a probe over the run's eval rows."""
    import torch
    from transformers import AutoModelForCausalLM

    from rewardplane.models.tiny import tiny_config
    from rewardplane.train.config import load_dpo_config
    from rewardplane.train.recipe import run

    torch.set_num_threads(1)  # 2 shared cores: intra-op threads only contend
    root = tmp_path_factory.mktemp("dpo")
    tokenizer = builtin_tokenizer()
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(tiny_config("tiny-llama", vocab_size=len(tokenizer)))
    base.save_pretrained(root / "base")
    tokenizer.save_pretrained(root / "base")
    overrides = [
        f"model.path={root / 'base'}",
        "data.tokenizer=builtin",
        f"data.synth.train_rows={TRAIN_ROWS}",
        f"data.synth.eval_rows={EVAL_ROWS}",
        f"data.max_length={SETTINGS.max_length}",
        f"data.max_completion_length={SETTINGS.max_completion_length}",
        f"run.max_steps={STEPS}",
        "run.global_batch_pairs=8",
        "run.eval_batch_size=16",
        "run.progress=false",
        f"run.run_dir={root / 'run'}",
        "optim.lr=5e-3",
        "optim.schedule=constant",
    ]
    result = run(load_dpo_config(None, overrides))
    rows = generate_rows(TRAIN_ROWS + EVAL_ROWS, seed=0)[TRAIN_ROWS:]
    data = root / "eval.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    probe = freeze_probe(tokenize_eval_data(data, tokenizer, SETTINGS), tokenizer, SETTINGS)
    (root / "probe.json").write_text(json.dumps(probe))
    return root, result.checkpoint


def _eval(root, checkpoint, out, *extra):
    args = ["eval", "--model", str(checkpoint), "--probe", str(root / "probe.json")]
    return main([*args, "--data", str(root / "eval.jsonl"), "--out", str(out), "--replicates", "100", *extra])


def test_implicit_rewards_match_the_training_evaluation(trained, tmp_path):
    root, checkpoint = trained
    assert (
        _eval(root, checkpoint, tmp_path / "out", "--reference", str(root / "base"), "--batch-size", "5") == 0
    )
    ours = read_pairs(tmp_path / "out" / "pairs.jsonl")
    training = read_pairs(eval_step_dir(root / "run", STEPS) / "pairs.jsonl")
    assert [r["pair_id"] for r in ours] == [r["pair_id"] for r in training]
    assert ours[0]["probe_sha256"] == training[0]["probe_sha256"]
    for key in ("chosen_score", "rejected_score", "pair_loss"):
        np.testing.assert_allclose([r[key] for r in ours], [r[key] for r in training], atol=1e-5, rtol=0)
    assert np.ptp([r["margin"] for r in ours]) > 0  # trained away from the reference: not all ties
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["objective"] == "dpo" and summary["model"]["reference_path"] == str(root / "base")


def test_reference_is_required_and_verified(trained, tmp_path, capsys):
    root, checkpoint = trained
    assert _eval(root, checkpoint, tmp_path / "a") == 2
    assert "pass --reference DIR" in capsys.readouterr().err
    assert (
        _eval(root, checkpoint, tmp_path / "b", "--reference", str(checkpoint)) == 2
    )  # the policy is not its reference
    assert "reference parameters differ" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_reference_flag_is_refused_for_reward_models(trained, tmp_path, capsys):
    root, _ = trained
    assert _eval(root, root / "base", tmp_path / "c", "--reference", str(root / "base")) == 2
    assert "--reference applies to DPO policies only" in capsys.readouterr().err


def test_dpo_scores_do_not_depend_on_batch_size(trained):
    from rewardplane.objectives.dpo import load_scorer

    root, checkpoint = trained
    scorer = load_scorer(checkpoint, device="cpu", reference_path=root / "base")
    pairs = tokenize_eval_data(root / "eval.jsonl", scorer.tokenizer, SETTINGS)
    runs = [np.stack(scorer.score(pairs, batch_size)) for batch_size in (1, 7, 64)]
    np.testing.assert_allclose(runs[1], runs[0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(runs[2], runs[0], atol=1e-5, rtol=0)
