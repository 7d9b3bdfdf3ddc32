"""DPO with LoRA adapters (peft): the base as reference, merged checkpoints, exact resume, refusals."""

from __future__ import annotations

import json

import pytest
import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from rewardplane.core.errors import ConfigError
from rewardplane.data.synth import builtin_tokenizer
from rewardplane.models.export import export_dpo_policy
from rewardplane.models.loading import CheckpointError
from rewardplane.models.lora import merged_state_dict
from rewardplane.models.reference import parameter_digest
from rewardplane.models.tiny import tiny_config
from rewardplane.objectives.base import TrainPairs
from rewardplane.train.recipe import build_objective, run
from support.dpo import REVISION, config, lora_config, metrics, sft_snapshot

IDS = torch.tensor([[5, 17, 42, 9, 3, 77, 12, 64]])


def built(cfg):
    """The objective's models as a run builds them (the Trainer seeds before building)."""
    from rewardplane.train.loop import seed_everything

    seed_everything(cfg.run.seed, 0)
    objective = build_objective(cfg, TrainPairs([], "x"))
    objective.build_model(builtin_tokenizer())
    return objective


def base_weights(policy):
    return {k: v.clone() for k, v in policy.get_base_model().state_dict().items() if "lora_" not in k}


def plain_base(objective):
    """The run's base as a plain causal LM (at build time B = 0, so merging gives the base)."""
    model = AutoModelForCausalLM.from_config(objective.policy.get_base_model().config)
    model.load_state_dict(merged_state_dict(objective.policy.state_dict(), objective.lora.scaling))
    return model


def test_the_reference_is_the_frozen_base_itself_and_only_adapters_train(tmp_path):
    objective = built(lora_config(tmp_path / "probe"))
    policy = objective.policy
    assert objective.reference is policy  # no copy: the base, reached with adapters disabled
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    sidecar = objective.checkpoint_metadata()["reference"]
    assert sidecar["source"] == "initial_policy" and sidecar["loader"].endswith("+peft.disable_adapter")
    # the digest is over the plain base, as a resumed run rebuilds it before wrapping
    assert sidecar["param_sha256"] == parameter_digest(plain_base(objective))


def test_lora_training_moves_the_margins_and_never_the_base(tmp_path):
    from rewardplane.train.data import prepare_data
    from rewardplane.train.loop import Trainer

    cfg = lora_config(tmp_path / "run", "run.max_steps=4", "model.gradient_checkpointing=true")
    data = prepare_data(cfg)
    objective = build_objective(cfg, TrainPairs(data.train, data.train_pairs_sha256))
    trainer = Trainer(
        cfg, objective, train_pairs=data.train, tokenizer=data.tokenizer, train_pairs_sha256="x"
    )
    frozen = {n: p.detach().clone() for n, p in objective.policy.named_parameters() if not p.requires_grad}
    optimised = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert optimised == {id(p) for p in objective.policy.parameters() if p.requires_grad}
    rows = [trainer.train_step() for _ in range(4)]
    assert rows[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-6)  # B = 0: policy == reference
    assert rows[0]["loss"] == pytest.approx(0.6931471805599453, abs=1e-5)
    assert rows[-1]["rewards/margins"] > rows[0]["rewards/margins"] + 1e-3
    assert rows[-1]["loss"] < rows[0]["loss"]
    for name, p in objective.policy.named_parameters():
        if name in frozen:
            assert torch.equal(p, frozen[name]), name


def test_checkpoints_merge_like_peft_and_export_a_plain_causal_lm(tmp_path):
    result = run(lora_config(tmp_path / "run", "run.max_steps=2"))
    ckpt = result.checkpoint
    merged = AutoModelForCausalLM.from_pretrained(ckpt, local_files_only=True).eval()
    base = plain_base(built(lora_config(tmp_path / "probe"))).eval()  # the run's base: same seed, same init
    with torch.no_grad():
        base_logits = base(IDS).logits
    assert not (ckpt / "adapter_config.json").exists()  # else transformers applies it over the merge
    peft_model = PeftModel.from_pretrained(base, ckpt / "adapter").eval()  # peft reads the adapter files
    with torch.no_grad():
        want = peft_model(IDS).logits
        assert not torch.allclose(want, base_logits)  # the adapters trained
        assert torch.allclose(merged(IDS).logits, want, atol=1e-5, rtol=0)
    export_dpo_policy(ckpt, tmp_path / "hf")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(IDS).logits, merged(IDS).logits)


def test_merged_state_dict_equals_peft_merge_and_unload():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("tiny-llama", vocab_size=300))
    peft_model = get_peft_model(model, PeftLoraConfig(r=4, lora_alpha=12, target_modules="all-linear"))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_()  # a trained adapter, not the zero init
    ours = merged_state_dict(peft_model.state_dict(), 12 / 4)
    theirs = peft_model.merge_and_unload().state_dict()
    assert ours.keys() == theirs.keys()
    for k, v in theirs.items():
        assert torch.allclose(ours[k], v, atol=1e-6, rtol=0), k
    with pytest.raises(ValueError, match="not a peft"):
        merged_state_dict({"model.embed_tokens.weight": torch.zeros(1)}, 1.0)


def test_resume_restores_the_adapters_exactly(tmp_path):
    straight = tmp_path / "straight"
    run(lora_config(straight, "run.max_steps=3"))
    run_dir = tmp_path / "run"
    run(lora_config(run_dir, "run.max_steps=3", "run.save_every=1", "run.keep_last=5"))
    step1 = run_dir / "checkpoints" / "step-0000001"
    (run_dir / "metrics.jsonl").unlink()
    resumed = run(lora_config(run_dir, "run.max_steps=3", "run.keep_last=5"), resume=str(step1))
    assert resumed.step == 3
    want, got = metrics(straight)[1:], metrics(run_dir)
    assert [r["step"] for r in got] == [2, 3]
    for a, b in zip(want, got, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)
        assert b["rewards/margins"] == pytest.approx(a["rewards/margins"], abs=1e-6)
    with pytest.raises(CheckpointError, match="model.lora"):
        run(lora_config(run_dir, "run.max_steps=3", "run.keep_last=5", "model.lora.r=8"), resume=str(step1))
    with pytest.raises(CheckpointError, match="model.lora"):
        run(config(run_dir, "run.max_steps=3"), resume=str(step1))  # a full-parameter run


def test_precomputed_reference_equals_the_live_base(tmp_path):
    run(lora_config(tmp_path / "live", "run.max_steps=2"))
    run(lora_config(tmp_path / "cached", "run.max_steps=2", "dpo.precompute_reference=true"))
    for a, b in zip(metrics(tmp_path / "live"), metrics(tmp_path / "cached"), strict=True):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)
        assert b["rewards/margins"] == pytest.approx(a["rewards/margins"], abs=1e-6)


def test_a_pinned_snapshot_reference_is_a_separate_model_that_precompute_frees(tmp_path):
    snapshot = sft_snapshot(tmp_path / "sft")
    overrides = (
        "model.lora.r=4",
        "dpo.reference.source=snapshot",
        "dpo.reference.repo=acme/sft",
        f"dpo.reference.revision={REVISION}",
        f"dpo.reference.path={snapshot}",
        "model.tiny=null",
        f"model.path={snapshot}",
    )
    objective = built(config(tmp_path / "probe", *overrides, "dpo.precompute_reference=true"))
    assert objective.reference is not objective.policy
    objective.train_pairs = []
    objective._prepare(torch.device("cpu"))
    assert objective.reference is None  # scored, then released
    result = run(config(tmp_path / "run", *overrides, "run.max_steps=2"))
    meta = json.loads((result.checkpoint / "rewardplane.json").read_text())
    assert meta["reference"]["source"] == "snapshot" and meta["lora"]["r"] == 4
    assert metrics(tmp_path / "run")[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("model.lora.dropout=0.1",), "dropout makes the policy's log-probs stochastic"),
        (("dpo.reference_dtype=bf16",), "has no dtype of its own"),
        (("model.lora.target_modules=[no_such_proj]",), "model.lora"),
        (("model.lora.target_modules=[embed_tokens]",), "only linear layers take adapters"),
        (("model.lora.r=0",), "model.lora.r must be >= 1"),
    ],
)
def test_settings_that_break_lora_dpo_are_refused(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        built(lora_config(tmp_path / "probe", *overrides))


@pytest.mark.timeout(240)  # a gloo teardown hang fails here instead of stalling the suite
@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_two_ranks_train_the_same_adapters_as_one_process(tmp_path, parallel):
    import torch.multiprocessing as mp

    from support.dist import SOLO, free_port
    from support.dpo_lora_dist_worker import adapters, lora_trainer, worker

    mp.spawn(worker, args=(2, free_port(), str(tmp_path), parallel), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    # FSDP2 shards each decoder block, then the root (tiny-llama has 2 blocks)
    assert ranks[0]["sharded_modules"] == (3 if parallel == "fsdp2" else 0)
    solo = lora_trainer(str(tmp_path / "solo"), info=SOLO)
    solo_losses = [solo.train_step()["loss"] for _ in range(2)]
    assert ranks[0]["losses"] == pytest.approx(solo_losses, abs=1e-6)
    for name, value in adapters(solo).items():
        assert torch.equal(ranks[0]["adapters"][name], ranks[1]["adapters"][name]), name  # in sync
        assert torch.allclose(ranks[0]["adapters"][name], value, atol=1e-6, rtol=0), name


@pytest.mark.slow
def test_compiled_blocks_train_the_adapters_like_eager(tmp_path):
    """`run.compile` compiles the decoder blocks inside the peft wrapper, adapters included."""
    from support.dist import SOLO
    from support.dpo_lora_dist_worker import lora_trainer

    steps = ("run.max_steps=3",)
    eager = lora_trainer(str(tmp_path / "eager"), info=SOLO, overrides=steps)
    compiled = lora_trainer(str(tmp_path / "compiled"), info=SOLO, overrides=(*steps, "run.compile=true"))
    layers = compiled.raw_model.get_base_model().model.layers
    assert all(getattr(layer, "_compiled_call_impl", None) is not None for layer in layers)
    for _ in range(3):
        assert compiled.train_step()["loss"] == pytest.approx(eager.train_step()["loss"], abs=1e-5)
    assert compiled.train_step()["rewards/margins"] != 0.0  # the adapters moved
