import json

import pytest
import torch
import torch.multiprocessing as mp

from rewardplane.core.errors import ConfigError
from rewardplane.train.distributed import DistInfo
from support.dist import SOLO, free_port
from support.rm import make_trainer, random_pairs, train_config
from support.rm_dist_worker import worker


def _grads(trainer):
    trainer.forward_backward()
    return {n: p.grad.detach().clone() for n, p in trainer.raw_model.named_parameters()}


def _assert_same(a, b, atol=1e-6):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name], b[name], atol=atol, rtol=0), (name, (a[name] - b[name]).abs().max())


@pytest.mark.parametrize("layout", ["packed", "right"])
def test_gradient_is_identical_for_accumulation_1_and_4(tmp_path, layout):
    one = make_trainer(train_config(tmp_path / "a", run={"grad_accum": 1, "layout": layout}), info=SOLO)
    four = make_trainer(train_config(tmp_path / "b", run={"grad_accum": 4, "layout": layout}), info=SOLO)
    assert len(four.sampler.split(four.sampler.step_indices(0, 0))[0]) == 4
    _assert_same(_grads(one), _grads(four))


@pytest.mark.timeout(240)  # a gloo teardown hang fails here instead of stalling the suite
@pytest.mark.slow
def test_gradient_is_identical_for_dp1_and_dp2(tmp_path):
    mp.spawn(worker, args=(2, free_port(), str(tmp_path), "ddp", "grad"), nprocs=2, join=True)
    dp2 = torch.load(tmp_path / "ddp-grad.pt", weights_only=True)
    dp1 = _grads(make_trainer(train_config(tmp_path / "solo"), info=SOLO))
    _assert_same(dp1, dp2)


@pytest.mark.timeout(240)  # a gloo teardown hang fails here instead of stalling the suite
@pytest.mark.slow
def test_fsdp2_matches_ddp_losses_on_two_gloo_ranks(tmp_path):
    for parallel in ("ddp", "fsdp2"):
        mp.spawn(worker, args=(2, free_port(), str(tmp_path), parallel, "loss"), nprocs=2, join=True)
    ddp = torch.load(tmp_path / "ddp-loss.pt", weights_only=True)
    fsdp = torch.load(tmp_path / "fsdp2-loss.pt", weights_only=True)
    assert ddp == pytest.approx(fsdp, abs=1e-5)


@pytest.mark.timeout(240)  # a gloo teardown hang fails here instead of stalling the suite
@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_two_ranks_share_the_probe_and_match_single_process_scores(tmp_path, parallel):
    from support.rm_dist_worker import EVAL_PAIRS

    mp.spawn(worker, args=(2, free_port(), str(tmp_path), parallel, "eval"), nprocs=2, join=True)
    result = json.loads((tmp_path / f"{parallel}-eval.json").read_text())
    assert result["scored_per_rank"] == [[6], [6]]  # ceil(11 / 2) each, not 11 each
    assert result["summary"]["batch_plan"]["eval_ranks"] == 2 and result["summary"]["n_pairs"] == EVAL_PAIRS
    solo = make_trainer(
        train_config(tmp_path / "solo"), eval_pairs=random_pairs(EVAL_PAIRS, seed=5, max_len=20), info=SOLO
    )
    assert "eval_ranks" not in solo.evaluate()["batch_plan"]

    def rows(run_dir):
        path = run_dir / "eval" / "step-0000000" / "pairs.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]

    shared, alone = rows(tmp_path / "run"), rows(tmp_path / "solo")
    assert [r["pair_id"] for r in shared] == [r["pair_id"] for r in alone]
    for a, b in zip(shared, alone, strict=True):
        assert a["chosen_score"] == pytest.approx(b["chosen_score"], abs=1e-5)
        assert a["rejected_score"] == pytest.approx(b["rejected_score"], abs=1e-5)


@pytest.mark.timeout(240)  # a gloo teardown hang fails here instead of stalling the suite
@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_two_rank_resume_reproduces_the_uninterrupted_losses(tmp_path, parallel):
    for mode in ("uninterrupted", "resume"):
        mp.spawn(worker, args=(2, free_port(), str(tmp_path), parallel, mode), nprocs=2, join=True)
    full = json.loads((tmp_path / f"{parallel}-uninterrupted.json").read_text())
    resumed = json.loads((tmp_path / f"{parallel}-resume.json").read_text())
    assert sorted(full) == ["1", "2", "3", "4"] and sorted(resumed) == ["3", "4"]
    assert [resumed[s] for s in ("3", "4")] == [full[s] for s in ("3", "4")]  # bit for bit


def test_eval_shards_are_equal_length_and_cover_the_probe_in_order():
    from rewardplane.train.loop import eval_shard

    pairs = list(range(7))
    shards = [eval_shard(pairs, rank, 3) for rank in range(3)]
    assert shards == [[0, 1, 2], [3, 4, 5], [6, 6, 6]]
    assert [p for shard in shards for p in shard][: len(pairs)] == pairs
    assert eval_shard(pairs[:1], 1, 2) == [0]  # fewer pairs than ranks: every rank still forwards


def test_fit_writes_run_dir_and_loss_falls(tmp_path):
    cfg = train_config(
        tmp_path / "run", run={"max_steps": 12, "save_every": 5, "keep_last": 2}, optim={"lr": 3e-3}
    )
    pairs = random_pairs(32, seed=4)
    result = make_trainer(cfg, pairs, eval_pairs=random_pairs(6, seed=9), info=SOLO).fit()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == list(range(1, 13))
    keys = {"loss", "accuracy", "tie_rate", "chosen_mean", "chosen_std", "rejected_mean", "rejected_std"}
    keys |= {
        "margin_mean",
        "margin_std",
        "grad_norm",
        "lr",
        "pairs_per_s",
        "tokens_per_s",
        "padding_efficiency",
    }
    assert keys <= lines[0].keys()
    assert sum(m["loss"] for m in lines[-3:]) < sum(m["loss"] for m in lines[:3])
    ckpts = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert ckpts == ["step-0000010", "step-0000012"]  # keep_last=2 pruned step 5
    assert result.checkpoint.name == "step-0000012"
    assert sorted(result.eval_summaries) == [0, 12]
    assert (tmp_path / "run" / "eval" / "step-0000000" / "pairs.jsonl").is_file()
    assert (tmp_path / "run" / "config.yaml").read_text().startswith("model:")


def test_global_batch_smaller_than_micro_batches_is_refused(tmp_path):
    cfg = train_config(tmp_path, run={"global_batch_pairs": 2, "grad_accum": 4})
    with pytest.raises(ConfigError, match="every micro-batch needs at least one pair"):
        make_trainer(cfg, info=SOLO)


@pytest.mark.gpu
def test_cuda_bf16_autocast_keeps_fp32_head_and_trains(tmp_path):
    cuda = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cuda"))
    cfg = train_config(tmp_path, run={"max_steps": 6, "precision": "auto"}, optim={"lr": 3e-3})
    trainer = make_trainer(cfg, random_pairs(8, seed=4), info=cuda)
    assert trainer.precision == "bf16"
    losses = [trainer.train_step()["loss"] for _ in range(6)]
    assert losses[-1] < losses[0]
    assert trainer.raw_model.head.weight.dtype == torch.float32


@pytest.mark.slow
def test_compiled_blocks_give_the_eager_losses(tmp_path):
    pairs = random_pairs(16, seed=5)
    eager = make_trainer(train_config(tmp_path / "eager", run={"max_steps": 3}), pairs, info=SOLO)
    compiled = make_trainer(
        train_config(tmp_path / "compiled", run={"max_steps": 3, "compile": True}), pairs, info=SOLO
    )
    layers = compiled.raw_model.backbone.layers
    assert all(
        hasattr(layer, "_compiled_call_impl") and layer._compiled_call_impl is not None for layer in layers
    )
    for _ in range(3):
        assert compiled.train_step()["loss"] == pytest.approx(eager.train_step()["loss"], abs=1e-5)


@pytest.mark.gpu
def test_cuda_packed_varlen_compiled_training_matches_sdpa(tmp_path):
    """The production GPU path (rk_varlen + compile + fused AdamW) trains like plain SDPA."""
    cuda = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cuda"))
    pairs = random_pairs(16, seed=6)
    losses = {}
    for name, model, run in (
        ("sdpa", {"attn_implementation": "sdpa"}, {}),
        ("varlen", {"attn_implementation": "rk_varlen"}, {"compile": True}),
    ):
        cfg = train_config(tmp_path / name, model=model, run={"max_steps": 4, "precision": "bf16", **run})
        trainer = make_trainer(cfg, pairs, info=cuda)
        assert trainer.raw_model.config._attn_implementation == model["attn_implementation"]
        losses[name] = [trainer.train_step()["loss"] for _ in range(4)]
    assert losses["varlen"] == pytest.approx(losses["sdpa"], abs=2e-2)


class _RecordingWriter:
    """Stands in for torch.utils.tensorboard.SummaryWriter (the tensorboard package is optional)."""

    instances: list["_RecordingWriter"] = []

    def __init__(self, log_dir: str) -> None:
        self.log_dir, self.scalars, self.closed = log_dir, [], False
        _RecordingWriter.instances.append(self)

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, float(value), step))

    def close(self):
        self.closed = True


def test_tensorboard_gets_every_train_step_and_each_eval(tmp_path, monkeypatch):
    import sys
    import types

    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = _RecordingWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    _RecordingWriter.instances.clear()
    cfg = train_config(tmp_path, run={"max_steps": 3, "eval_every": 2, "tensorboard": True})
    make_trainer(cfg, eval_pairs=random_pairs(6, seed=3, max_len=20), info=SOLO).fit()
    (writer,) = _RecordingWriter.instances
    assert writer.log_dir == str(tmp_path / "tensorboard") and writer.closed
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_loss = [(step, value) for tag, value, step in writer.scalars if tag == "train/loss"]
    assert train_loss == [(m["step"], pytest.approx(m["loss"])) for m in logged] and len(logged) == 3
    eval_steps = sorted({step for tag, _, step in writer.scalars if tag.startswith("eval/")})
    assert eval_steps == [0, 2, 3]
    summary = json.loads((tmp_path / "eval" / "step-0000003" / "summary.json").read_text())
    final = {tag: value for tag, value, step in writer.scalars if step == 3 and tag.startswith("eval/")}
    assert final["eval/accuracy"] == pytest.approx(summary["accuracy"])
    assert final["eval/accuracy_lower_95"] == pytest.approx(summary["bootstrap"]["strict"]["lower_95"])


def test_tensorboard_without_the_package_is_a_clear_error(tmp_path, monkeypatch):
    import sys

    from rewardplane.core.errors import UsageError

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import raises ImportError
    cfg = train_config(tmp_path, run={"max_steps": 1, "tensorboard": True})
    with pytest.raises(UsageError, match="tensorboard package"):
        make_trainer(cfg, info=SOLO).fit()
