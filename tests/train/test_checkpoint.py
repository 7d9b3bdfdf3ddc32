import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rewardplane.models.loading import CheckpointError, load_reward_model
from rewardplane.objectives.reward_model import score_pairs
from rewardplane.train.checkpoint import latest_checkpoint, list_checkpoints
from rewardplane.train.distributed import DistInfo
from support.rm import make_trainer, random_pairs, train_config

SOLO = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
TESTS = Path(__file__).resolve().parents[1]


def _losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """8 steps of tiny-bert (dropout on, so RNG state matters), checkpoints every 3 steps."""
    root = tmp_path_factory.mktemp("full")
    cfg = train_config(
        root, model={"tiny": "tiny-bert"}, run={"max_steps": 8, "save_every": 3, "keep_last": 5}
    )
    pairs = random_pairs(24, seed=5)
    result = make_trainer(cfg, pairs, eval_pairs=random_pairs(5, seed=8), info=SOLO).fit()
    return root, cfg, pairs, result


def test_resume_reproduces_losses_bit_for_bit(finished_run, tmp_path):
    root, _cfg, pairs, _ = finished_run
    run = tmp_path / "resumed"
    run.mkdir()
    cfg = train_config(
        run, model={"tiny": "tiny-bert"}, run={"max_steps": 8, "save_every": 3, "keep_last": 5}
    )
    trainer = make_trainer(cfg, pairs, eval_pairs=random_pairs(5, seed=8), info=SOLO)
    trainer.resume(root / "checkpoints" / "step-0000003")
    assert trainer.step == 3 and trainer.pairs_consumed == 24
    trainer.fit()
    full, resumed = _losses(root), _losses(run)
    assert sorted(resumed) == [4, 5, 6, 7, 8]
    assert [resumed[s] for s in range(4, 9)] == [full[s] for s in range(4, 9)]  # exact equality


def test_checkpoint_reloads_with_identical_scores(finished_run):
    root, _cfg, pairs, result = finished_run
    model, tokenizer, meta = load_reward_model(result.checkpoint)
    assert meta["objective"] == "reward_model" and meta["step"] == 8 and meta["pairs_consumed"] == 64
    assert meta["train_pairs_sha256"] == "data-a" and len(meta["model_sha256"]) == 64
    assert "data_manifest_sha256" not in meta  # the pre-46 name of the same digest (core/legacy.py)
    assert tokenizer.pad_token == "<|pad|>"
    summary = json.loads((root / "eval" / "step-0000008" / "summary.json").read_text())
    rows = [json.loads(x) for x in (root / "eval" / "step-0000008" / "pairs.jsonl").read_text().splitlines()]
    chosen, _ = score_pairs(model, random_pairs(5, seed=8), batch_size=4, layout="packed")
    assert [r["chosen_score"] for r in rows] == pytest.approx(chosen.tolist(), abs=1e-6)
    assert summary["n_pairs"] == 5


def _copy_ckpt(finished_run, tmp_path) -> Path:
    root = finished_run[0]
    dst = tmp_path / "ckpt"
    shutil.copytree(root / "checkpoints" / "step-0000006", dst)
    return dst


def _edit_meta(ckpt: Path, **changes) -> None:
    meta = json.loads((ckpt / "rewardplane.json").read_text())
    meta.update(changes)
    (ckpt / "rewardplane.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"objective": "dpo", "role": "policy"}, "wrong_objective"),
        ({"objective": "critic", "role": "critic"}, "wrong_objective"),
        ({"head_type": "hf_seqcls"}, "wrong_head"),
        ({"train_pairs_sha256": "other"}, "data_mismatch"),
        ({"world_size": 2}, "world_size_mismatch"),
        ({"format_version": 99}, "format_version"),
    ],
)
def test_resume_refusals(finished_run, tmp_path, change, code):
    ckpt = _copy_ckpt(finished_run, tmp_path)
    _edit_meta(ckpt, **change)
    cfg = train_config(tmp_path / "run", model={"tiny": "tiny-bert"})
    trainer = make_trainer(cfg, finished_run[2], info=SOLO)
    with pytest.raises(CheckpointError) as err:
        trainer.resume(ckpt)
    assert err.value.code == code


def test_resume_reads_the_pre_46_key_of_the_training_pairs_digest(finished_run, tmp_path):
    """A checkpoint written before the rename records the digest as `data_manifest_sha256`: a
    resume on the same data continues it; on other data it is refused as before."""
    ckpt = _copy_ckpt(finished_run, tmp_path)
    meta = json.loads((ckpt / "rewardplane.json").read_text())
    meta["data_manifest_sha256"] = meta.pop("train_pairs_sha256")
    (ckpt / "rewardplane.json").write_text(json.dumps(meta))
    cfg = train_config(tmp_path / "run", model={"tiny": "tiny-bert"}, run={"max_steps": 8})
    make_trainer(cfg, finished_run[2], info=SOLO).resume(ckpt)
    other = make_trainer(cfg, finished_run[2], train_pairs_sha256="data-b", info=SOLO)
    with pytest.raises(CheckpointError) as err:
        other.resume(ckpt)
    assert err.value.code == "data_mismatch"


def test_resume_allows_new_data_only_when_asked(finished_run, tmp_path):
    ckpt = _copy_ckpt(finished_run, tmp_path)
    cfg = train_config(tmp_path / "run", model={"tiny": "tiny-bert"}, run={"max_steps": 8})
    trainer = make_trainer(cfg, random_pairs(16, seed=99), train_pairs_sha256="data-b", info=SOLO)
    trainer.resume(ckpt, allow_new_data=True)
    assert trainer.step == 6 and trainer.sampler.state.step_in_epoch == 0


@pytest.mark.parametrize("missing", ["optimizer.pt", "rng.pt", "trainer_state.json"])
def test_resume_refuses_checkpoint_without_state(finished_run, tmp_path, missing):
    ckpt = _copy_ckpt(finished_run, tmp_path)
    (ckpt / missing).unlink()
    trainer = make_trainer(
        train_config(tmp_path / "run", model={"tiny": "tiny-bert"}), finished_run[2], info=SOLO
    )
    with pytest.raises(CheckpointError, match=missing) as err:
        trainer.resume(ckpt)
    assert err.value.code == "missing_state"


def test_resume_refuses_plain_language_model(tmp_path):
    from transformers import AutoModelForCausalLM

    from rewardplane.models.tiny import tiny_config

    AutoModelForCausalLM.from_config(tiny_config("tiny-llama", vocab_size=97)).save_pretrained(
        tmp_path / "lm"
    )
    trainer = make_trainer(train_config(tmp_path / "run"), info=SOLO)
    with pytest.raises(CheckpointError) as err:
        trainer.resume(tmp_path / "lm")
    assert err.value.code == "not_rewardplane"


def test_resume_refuses_another_eval_batch_size_and_the_final_eval_another_batch_plan(finished_run, tmp_path):
    """`run.eval_batch_size` is not on the resume allow-list; a plan that changes anyway (here set
    after the resume, as another device type would) is refused by the final evaluation."""
    from rewardplane.core.errors import RewardplaneError

    root, _cfg, pairs, _ = finished_run
    cfg = train_config(
        tmp_path / "run", model={"tiny": "tiny-bert"}, run={"max_steps": 7, "eval_batch_size": 2}
    )
    trainer = make_trainer(cfg, pairs, eval_pairs=random_pairs(5, seed=8), info=SOLO)
    with pytest.raises(CheckpointError) as err:
        trainer.resume(root / "checkpoints" / "step-0000006")
    assert (
        err.value.code == "resume_config_mismatch" and "run.eval_batch_size was 4, now 2" in err.value.message
    )
    cfg = train_config(tmp_path / "run", model={"tiny": "tiny-bert"}, run={"max_steps": 7})
    trainer = make_trainer(cfg, pairs, eval_pairs=random_pairs(5, seed=8), info=SOLO)
    trainer.resume(root / "checkpoints" / "step-0000006")
    trainer.cfg.run.eval_batch_size = 2
    with pytest.raises(RewardplaneError) as err:
        trainer.fit()
    assert err.value.code == "eval_contract_mismatch"


CRASH_SCRIPT = """
import sys, time
sys.path.insert(0, {here!r})
import safetensors.torch as st
from support.rm import make_trainer, train_config
from rewardplane.train.distributed import DistInfo
import torch

trainer = make_trainer(train_config({run!r}, run={{"max_steps": 2}}),
                       info=DistInfo(0, 1, 0, torch.device("cpu")))
trainer.train_step()
trainer.save()                      # step 1: complete
trainer.train_step()
real_save = st.save_file
def slow_save(tensors, filename, metadata=None):
    real_save(tensors, filename, metadata=metadata)
    open({marker!r}, "w").close()   # weights of step 2 are on disk, metadata is not
    time.sleep(120)
st.save_file = slow_save
trainer.save()
"""


def test_crash_during_save_leaves_previous_checkpoint_loadable(tmp_path):
    run, marker = tmp_path / "run", tmp_path / "mid-save"
    script = CRASH_SCRIPT.format(here=str(TESTS), run=str(run), marker=str(marker))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS.parent / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert proc.poll() is None, "trainer exited before reaching the save"
            assert time.monotonic() < deadline
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    ckpts = run / "checkpoints"
    assert [p.name for p in list_checkpoints(ckpts)] == ["step-0000001"]
    assert any(p.name.startswith(".step-0000002") for p in ckpts.iterdir())  # the torn temp dir
    assert latest_checkpoint(ckpts).name == "step-0000001"
    model, _tok, meta = load_reward_model(ckpts / "step-0000001")
    assert meta["step"] == 1
    trainer = make_trainer(train_config(run, run={"max_steps": 2}), info=SOLO)
    trainer.resume(ckpts / "step-0000001")
    trainer.train_step()
    trainer.save()
    assert [p.name for p in list_checkpoints(ckpts)] == ["step-0000001", "step-0000002"]
    assert not any(p.name.startswith(".step-") for p in ckpts.iterdir())  # stale temp dir pruned


def test_resume_refuses_corrupt_weights_before_loading(finished_run, tmp_path):
    ckpt = _copy_ckpt(finished_run, tmp_path)
    weights = ckpt / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-8:] = bytes(b ^ 0x55 for b in data[-8:])  # same size, last tensor's bytes changed
    weights.write_bytes(bytes(data))
    cfg = train_config(tmp_path / "run", model={"tiny": "tiny-bert"}, run={"max_steps": 8})
    trainer = make_trainer(cfg, finished_run[2], eval_pairs=random_pairs(5, seed=8), info=SOLO)
    with pytest.raises(CheckpointError) as err:
        trainer.resume(ckpt)
    assert err.value.code == "sha256_mismatch" and str(weights) in err.value.message
