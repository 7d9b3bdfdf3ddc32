"""DPO through the shared loop: metrics, precomputed reference, resume checks, pinned reference, export."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rewardplane.cli import main
from rewardplane.data.synth import builtin_tokenizer
from rewardplane.models.export import export_dpo_policy
from rewardplane.models.loading import CheckpointError
from rewardplane.models.reference import ReferenceMismatchError, ReferenceVerificationError
from rewardplane.train.recipe import run
from support.dpo import OVERRIDES, REVISION, config, metrics, sft_snapshot

TRL_METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "rewards/tie_rate",
    "rewards/accuracies_tie_aware",
    "logps/chosen",
    "logps/rejected",
)


def test_cli_trains_logs_trl_metrics_and_exports_a_plain_causal_lm(tmp_path, capsys):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("model: {tiny: tiny-llama}\ndpo: {loss_type: sigmoid, beta: 0.1}\n")
    overrides = [o for o in OVERRIDES if not o.startswith("model.")]
    assert main(["train", "dpo", "--config", str(cfg), *overrides, f"run.run_dir={tmp_path / 'run'}"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    result_checkpoint = Path(result["checkpoint"])
    rows = metrics(tmp_path / "run")
    assert len(rows) == 3 and all(key in rows[0] for key in TRL_METRICS)
    first = rows[0]
    # step 1 starts at the reference: every implicit reward is 0, every pair a tie
    assert first["rewards/margins"] == pytest.approx(0.0, abs=1e-6)
    assert first["rewards/tie_rate"] == 1.0 and first["rewards/accuracies_tie_aware"] == 0.5
    assert first["loss"] == pytest.approx(0.6931471805599453, abs=1e-5)  # log 2
    meta = json.loads((result_checkpoint / "rewardplane.json").read_text())
    assert meta["objective"] == "dpo" and meta["reference"]["source"] == "initial_policy"

    assert main(["export", "hf", str(result_checkpoint), str(tmp_path / "hf")]) == 0
    exported = tmp_path / "hf"
    assert not (exported / "rewardplane.json").exists() and not (exported / "optimizer.pt").exists()
    reloaded = AutoModelForCausalLM.from_pretrained(exported, local_files_only=True).eval()
    trained = AutoModelForCausalLM.from_pretrained(result_checkpoint, local_files_only=True).eval()
    ids = torch.tensor([[5, 17, 42, 9, 3, 77, 12]])
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, trained(ids).logits)
    with pytest.raises(CheckpointError, match="not a DPO policy"):
        meta["objective"] = "reward_model"
        (result_checkpoint / "rewardplane.json").write_text(json.dumps(meta))
        export_dpo_policy(result_checkpoint, tmp_path / "hf2")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("dpo.temperature=0.7", "DPO log-probs are taken at temperature 1"),
        ("model.config_overrides.attention_dropout=0.1", "policy has dropout > 0"),
        ("model.lora.r=8", "LoRA needs an explicit reference strategy"),
        ("dpo.reference_dtype=fp16", "dpo.reference_dtype must be one of fp32, bf16"),
    ],
)
def test_cli_refuses_settings_that_break_dpo(tmp_path, capsys, override, message):
    argv = ["train", "dpo", *OVERRIDES, f"run.run_dir={tmp_path / 'run'}", override]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_precomputed_reference_trains_like_the_live_one(tmp_path):
    live = run(config(tmp_path / "live", "run.max_steps=2"))
    # gradient checkpointing changes memory, not values: it rides along here
    overrides = ("run.max_steps=2", "dpo.precompute_reference=true", "model.gradient_checkpointing=true")
    cached = run(config(tmp_path / "cached", *overrides))
    assert len(list((tmp_path / "cached" / "reference_cache").glob("*.safetensors"))) == 2  # train + eval
    for a, b in zip(metrics(tmp_path / "live"), metrics(tmp_path / "cached"), strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["rewards/margins"] == pytest.approx(b["rewards/margins"], abs=1e-6)
    assert live.final_accuracy == pytest.approx(cached.final_accuracy, abs=1e-9)


def test_the_reference_pass_runs_before_the_policy_moves_to_the_device(tmp_path):
    """The trainer scores and frees a precomputed reference while the policy is still on the
    CPU, so on an accelerator the two models never share the device."""
    from rewardplane.objectives.base import TrainPairs
    from rewardplane.train.data import prepare_data
    from rewardplane.train.loop import Trainer
    from rewardplane.train.recipe import build_objective

    cfg = config(tmp_path / "run", "run.max_steps=1", "dpo.precompute_reference=true")
    data = prepare_data(cfg)
    objective = build_objective(cfg, TrainPairs(data.train, data.train_pairs_sha256))
    events: list = []
    build, prepare = objective.build_model, objective.prepare

    def build_spied(tokenizer):
        model = build(tokenizer)
        move = model.to
        model.to = lambda *a, **k: events.append("policy.to") or move(*a, **k)
        return model

    objective.build_model = build_spied
    objective.prepare = lambda device: (
        events.append(("prepare", objective.reference is not None)) or prepare(device)
    )
    Trainer(
        cfg,
        objective,
        train_pairs=data.train,
        tokenizer=data.tokenizer,
        train_pairs_sha256=data.train_pairs_sha256,
    )
    assert events == [("prepare", True), "policy.to"]
    assert objective.reference is None  # scored, then freed
    assert list((tmp_path / "run" / "reference_cache").glob("*.safetensors"))


def test_bf16_reference_is_stored_in_bf16_and_trains_like_the_fp32_one(tmp_path):
    from rewardplane.objectives.base import TrainPairs
    from rewardplane.train.recipe import build_objective

    cfg = config(tmp_path / "probe", "dpo.reference_dtype=bf16")
    objective = build_objective(cfg, TrainPairs([], "x"))
    objective.build_model(builtin_tokenizer())
    assert {p.dtype for p in objective.reference.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in objective.policy.parameters()} == {torch.float32}

    fp32 = run(config(tmp_path / "fp32", "run.max_steps=2"))
    bf16 = run(config(tmp_path / "bf16", "run.max_steps=2", "dpo.reference_dtype=bf16"))
    rows_fp32, rows_bf16 = metrics(tmp_path / "fp32"), metrics(tmp_path / "bf16")
    # step 1: the same fp32 policy; only the reference's log-probs carry bf16 rounding
    assert rows_bf16[0]["logps/chosen"] == pytest.approx(rows_fp32[0]["logps/chosen"], abs=1e-6)
    assert rows_bf16[0]["rewards/margins"] != rows_fp32[0]["rewards/margins"]  # the cast took effect
    for a, b in zip(rows_fp32, rows_bf16, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], abs=2e-2)
    digests = [
        json.loads((r.checkpoint / "rewardplane.json").read_text())["reference"]["param_sha256"]
        for r in (fp32, bf16)
    ]
    assert digests[0] != digests[1]  # the cache key and resume check tell the dtypes apart


def test_resume_recomputes_and_compares_the_reference_sidecar(tmp_path):
    run_dir = tmp_path / "run"
    run(config(run_dir, "run.max_steps=2", "run.save_every=1", "run.keep_last=3"))
    step1 = run_dir / "checkpoints" / "step-0000001"
    resumed = run(config(run_dir, "run.max_steps=2"), resume=str(step1))
    assert resumed.step == 2
    meta = json.loads((step1 / "rewardplane.json").read_text())
    meta["reference"]["param_sha256"] = "0" * 64
    (step1 / "rewardplane.json").write_text(json.dumps(meta))
    with pytest.raises(ReferenceMismatchError, match="param_sha256 changed"):
        run(config(run_dir, "run.max_steps=2"), resume=str(step1))
    with pytest.raises(CheckpointError, match="dpo.beta"):
        run(config(run_dir, "run.max_steps=2", "dpo.beta=0.5"), resume=str(step1))


def test_pinned_snapshot_reference(tmp_path):
    """SFT → DPO: policy and reference both start from a verified local_dir snapshot."""
    snapshot = sft_snapshot(tmp_path / "sft")
    reference = [
        "dpo.reference.source=snapshot",
        "dpo.reference.repo=acme/sft",
        f"dpo.reference.revision={REVISION}",
        f"dpo.reference.path={snapshot}",
    ]
    result = run(
        config(tmp_path / "run", "model.tiny=null", f"model.path={snapshot}", "run.max_steps=1", *reference)
    )
    meta = json.loads((result.checkpoint / "rewardplane.json").read_text())
    assert meta["reference"]["repo"] == "acme/sft" and meta["reference"]["revision"] == REVISION
    assert metrics(tmp_path / "run")[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-6)

    copy = tmp_path / "elsewhere"
    shutil.copytree(snapshot, copy)
    (copy / "config.json").write_text((copy / "config.json").read_text() + "\n")  # still valid JSON
    with pytest.raises(ReferenceVerificationError, match="config.json: content hash"):
        run(
            config(
                tmp_path / "run2",
                "model.tiny=null",
                f"model.path={snapshot}",
                *reference[:-1],
                f"dpo.reference.path={copy}",
            )
        )


def test_precompute_scores_in_training_micro_batches_unless_told(tmp_path, monkeypatch):
    """The pass runs beside the policy on the device: a bigger batch would set the peak memory."""
    import rewardplane.objectives.dpo as objective

    seen = []
    real = objective.precompute_reference

    def spy(reference, pairs, **kwargs):
        seen.append(kwargs["batch_size"])
        return real(reference, pairs, **kwargs)

    monkeypatch.setattr(objective, "precompute_reference", spy)
    run(config(tmp_path / "a", "run.max_steps=1", "run.grad_accum=4", "dpo.precompute_reference=true"))
    run(
        config(
            tmp_path / "b", "run.max_steps=1", "dpo.precompute_reference=true", "dpo.reference_batch_size=3"
        )
    )
    assert seen == [2, 2, 3, 3]  # train and eval passes: 8 pairs / 4 micro-batches, then as configured
