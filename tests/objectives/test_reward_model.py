"""The reward-model objective: Bradley–Terry micro-batches, metadata, and one scoring path."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rewardplane.core.errors import ConfigError
from rewardplane.data.synth import builtin_tokenizer
from rewardplane.models.loading import CheckpointError
from rewardplane.objectives import registry
from rewardplane.objectives.losses import bradley_terry
from rewardplane.objectives.reward_model import RewardModelObjective, score_pairs
from rewardplane.train.recipe import build_objective
from support.dist import SOLO
from support.rm import make_trainer, random_pairs, train_config


def test_micro_batch_loss_matches_trl_formula(tmp_path):
    cfg = train_config(tmp_path, loss={"center_rewards_coefficient": 0.01})
    trainer = make_trainer(cfg, info=SOLO)
    pairs = [
        p.__class__(p.pair_id, p.chosen, p.rejected, margin=m, subset=None)
        for p, m in zip(random_pairs(6, seed=2), [0.5, None, 1.0, 0.0, -0.25, 2.0], strict=True)
    ]
    out = trainer.objective.micro_batch(trainer.model, pairs, torch.device("cpu"))
    with torch.no_grad():
        from rewardplane.data.collate import collate

        scores = trainer.raw_model(collate(pairs, layout="right"))
    c, r = scores[:6], scores[6:]
    margin = torch.tensor([0.5, 0.0, 1.0, 0.0, -0.25, 2.0])
    # TRL RewardTrainer.compute_loss: mean(-logsigmoid(c - r - margin)) + coef * mean((c + r)^2)
    trl = -torch.nn.functional.logsigmoid(c - r - margin).mean() + 0.01 * torch.mean((c + r) ** 2)
    assert out.loss_sum.item() / 6 == pytest.approx(trl.item(), abs=1e-6)
    assert torch.allclose(out.chosen, c, atol=1e-5)
    plain = bradley_terry(c, r).mean()
    assert plain.item() != pytest.approx(trl.item(), abs=1e-4)


def test_objective_metadata_describes_reward_model(tmp_path):
    trainer = make_trainer(train_config(tmp_path), info=SOLO)
    meta = trainer.objective.checkpoint_metadata()
    assert meta["objective"] == "reward_model" and meta["head_type"] == "linear_last_token"
    assert meta["base_model"]["random_init"] == "tiny-llama" and len(meta["base_model"]["sha256"]) == 64
    assert isinstance(trainer.objective, RewardModelObjective)
    assert trainer.raw_model.head.bias is None and trainer.raw_model.head.weight.dtype == torch.float32


def test_reward_models_refuse_adapters(tmp_path):
    from rewardplane.train.config import TrainConfig, from_dict

    cfg = from_dict(TrainConfig, {"model": {"tiny": "tiny-llama", "lora": {"r": 4}}})
    with pytest.raises(ConfigError, match="adapters are for DPO policies"):
        build_objective(cfg).build_model(builtin_tokenizer())


def test_training_probe_scores_and_the_saved_checkpoint_scores_are_one_path(tmp_path):
    """`Objective.score` (the loop's probe evaluation) and the registry's scorer of the written
    checkpoint (`rewardplane eval`) give the same scores for the same weights."""
    cfg = train_config(tmp_path / "run", run={"max_steps": 1, "layout": "right"})
    trainer = make_trainer(cfg, info=SOLO)
    trainer.train_step()
    checkpoint = trainer.save()
    pairs = random_pairs(9, seed=6, max_len=20)
    chosen, rejected, losses = trainer.objective.score(trainer.raw_model, pairs, 4)
    assert losses is None  # Bradley–Terry: the loss comes from the margin
    assert registry.checkpoint_objective(checkpoint) == "reward_model"
    scorer = registry.load_pair_scorer(checkpoint, device="cpu")
    assert scorer.objective == "reward_model"
    got_c, got_r, got_losses = scorer.score(pairs, 7)
    assert got_losses is None
    np.testing.assert_allclose(got_c, chosen, atol=1e-5, rtol=0)
    np.testing.assert_allclose(got_r, rejected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(score_pairs(trainer.raw_model, pairs, 2)[0], chosen, atol=1e-5, rtol=0)


def test_a_checkpoint_of_an_unknown_objective_has_no_scorer(tmp_path):
    (tmp_path / "rewardplane.json").write_text(json.dumps({"format_version": 1, "objective": "critic"}))
    with pytest.raises(CheckpointError, match="objective 'critic' has no scorer; known: dpo, reward_model"):
        registry.load_pair_scorer(tmp_path, device="cpu")
