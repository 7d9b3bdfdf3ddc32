import json

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from rewardplane.data.collate import collate
from rewardplane.data.synth import builtin_tokenizer
from rewardplane.models.loading import CheckpointError, HFSequenceClassifier, load_reward_model
from rewardplane.models.tiny import tiny_config
from rewardplane.objectives.registry import export_hf
from rewardplane.objectives.reward_model import score_pairs
from rewardplane.train.distributed import DistInfo
from support.rm import make_trainer, random_pairs, tiny_reward_model, train_config

SOLO = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for name in ("tiny-llama", "tiny-bert"):
        root = tmp_path_factory.mktemp(name)
        trainer = make_trainer(train_config(root, model={"tiny": name}, run={"max_steps": 2}), info=SOLO)
        out[name] = (trainer.fit().checkpoint, trainer.raw_model)
    return out


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-bert"])
def test_rewardplane_checkpoint_loads_with_identical_scores(checkpoints, name):
    path, trained = checkpoints[name]
    model, tokenizer, meta = load_reward_model(path)
    pairs = random_pairs(7, seed=21)
    expected = score_pairs(trained, pairs, batch_size=3)
    got = score_pairs(model, pairs, batch_size=7, layout="packed")
    assert abs(expected[0] - got[0]).max() < 1e-5 and abs(expected[1] - got[1]).max() < 1e-5
    assert not model.training and meta["head_type"] == "linear_last_token"
    assert len(tokenizer) == len(builtin_tokenizer())


def _save_seqcls(path, num_labels=1, family="tiny-llama"):
    tok = builtin_tokenizer()
    config = tiny_config(family, vocab_size=len(tok), num_labels=num_labels, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config).eval()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model, tok


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-bert"])
def test_hf_seqcls_dir_scores_like_plain_transformers(tmp_path, family):
    reference, tok = _save_seqcls(tmp_path / "hf", family=family)
    model, _tok, meta = load_reward_model(tmp_path / "hf")
    assert isinstance(model, HFSequenceClassifier) and meta["head_type"] == "hf_seqcls"
    pairs = random_pairs(5, seed=3)
    chosen, rejected = score_pairs(model, pairs, batch_size=2, layout="packed", pad_token_id=tok.pad_token_id)
    with torch.no_grad():
        for i, pair in enumerate(pairs):
            for branch, score in ((pair.chosen, chosen[i]), (pair.rejected, rejected[i])):
                plain = reference(input_ids=torch.tensor([branch.input_ids])).logits[0, 0].item()
                assert score == pytest.approx(plain, abs=1e-5)


def test_refuses_multi_label_and_foreign_dirs(tmp_path):
    _save_seqcls(tmp_path / "two", num_labels=2)
    with pytest.raises(CheckpointError) as err:
        load_reward_model(tmp_path / "two")
    assert err.value.code == "num_labels"
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError) as err:
        load_reward_model(tmp_path / "empty")
    assert err.value.code == "not_reward_model"


def test_refuses_checkpoint_of_another_objective(checkpoints, tmp_path):
    import shutil

    dst = tmp_path / "policy"
    shutil.copytree(checkpoints["tiny-llama"][0], dst)
    meta = json.loads((dst / "rewardplane.json").read_text())
    (dst / "rewardplane.json").write_text(json.dumps({**meta, "objective": "dpo", "role": "policy"}))
    with pytest.raises(CheckpointError) as err:
        load_reward_model(dst)
    assert err.value.code == "wrong_objective"


def test_export_hf_reloads_in_plain_transformers_with_same_scores(checkpoints, tmp_path):
    path, _ = checkpoints["tiny-llama"]
    report = export_hf(path, tmp_path / "out")
    assert report["architecture"] == "LlamaForSequenceClassification" and report["max_abs_diff"] <= 1e-5
    hf = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out", local_files_only=True).eval()
    ours, _tok, _meta = load_reward_model(path)
    pair = random_pairs(1, seed=0)[0]
    ids = pair.rejected.input_ids  # score_index is the last token for rejected branches
    with torch.no_grad():
        plain = hf(input_ids=torch.tensor([ids])).logits[0, 0].item()
        mine = ours(collate([pair]))[1].item()
    assert plain == pytest.approx(mine, abs=1e-5)
    # the export is itself loadable as a reward model scorer
    model, _tok, meta = load_reward_model(tmp_path / "out")
    assert meta["head_type"] == "hf_seqcls"


def test_export_hf_refuses_family_that_pools_differently(checkpoints, tmp_path):
    from rewardplane.models.export import ExportError

    with pytest.raises(ExportError, match="pools"):
        export_hf(checkpoints["tiny-bert"][0], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_init_from_hf_seqcls_copies_backbone_and_head(tmp_path):
    reference, _tok = _save_seqcls(tmp_path / "hf")
    cfg = train_config(tmp_path / "run", model={"tiny": None, "init_from": str(tmp_path / "hf")})
    trainer = make_trainer(cfg, info=SOLO)
    pair = random_pairs(1, seed=1)[0]
    with torch.no_grad():
        expected = reference(input_ids=torch.tensor([pair.rejected.input_ids])).logits[0, 0].item()
        got = trainer.raw_model.eval()(collate([pair]))[1].item()
    assert got == pytest.approx(expected, abs=1e-5)
    assert trainer.objective.checkpoint_metadata()["base_model"]["init_from"] == str(tmp_path / "hf")


def test_head_stays_fp32_under_bf16_autocast():
    model = tiny_reward_model()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        scores = model(collate(random_pairs(2, seed=0)))
    assert scores.dtype == torch.float32


def _corrupt(path, how):
    """Flip 16 bytes in the middle (same size) or cut the file in half."""
    data = bytearray(path.read_bytes())
    if how == "flip":
        middle = len(data) // 2
        data[middle : middle + 16] = bytes(b ^ 0xFF for b in data[middle : middle + 16])
    else:
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_corrupt_weights_are_refused_before_loading(checkpoints, tmp_path, how):
    import shutil

    dst = tmp_path / "ckpt"
    shutil.copytree(checkpoints["tiny-llama"][0], dst)
    meta = json.loads((dst / "rewardplane.json").read_text())
    recorded = meta["weight_files"]["model.safetensors"]
    assert recorded["size"] == (dst / "model.safetensors").stat().st_size
    assert recorded["sha256"] == meta["model_sha256"]
    _corrupt(dst / "model.safetensors", how)
    with pytest.raises(CheckpointError) as err:
        load_reward_model(dst)
    assert err.value.code == "sha256_mismatch"
    message = err.value.message
    assert "sha256 mismatch" in message and "model.safetensors" in message and "\n" not in message
    expected = str(recorded["size"]) if how == "truncate" else recorded["sha256"]
    assert expected in message and "actual" in message


def test_legacy_checkpoint_with_only_model_sha256_is_checked(checkpoints, tmp_path):
    import shutil

    dst = tmp_path / "old"
    shutil.copytree(checkpoints["tiny-llama"][0], dst)
    meta = json.loads((dst / "rewardplane.json").read_text())
    del meta["weight_files"]
    (dst / "rewardplane.json").write_text(json.dumps(meta))
    load_reward_model(dst)  # intact: loads
    _corrupt(dst / "model.safetensors", "flip")
    with pytest.raises(CheckpointError, match="sha256 mismatch"):
        load_reward_model(dst)


def test_hf_dir_without_recorded_digests_loads_as_before(tmp_path, monkeypatch):
    """An HF dir records no digests, so nothing is verified and the file is loaded as it is: the
    scores are a plain transformers forward of the changed weights, not the saved model's, and
    the metadata names the digest of the file that was read."""
    from rewardplane.core.hashing import sha256_file
    from rewardplane.models import loading

    original, tok = _save_seqcls(tmp_path / "hf")
    _corrupt(tmp_path / "hf" / "model.safetensors", "flip")  # nothing recorded, nothing to check
    verified = []
    monkeypatch.setattr(loading, "verify_files", lambda *a, **k: verified.append(a))
    model, _tok, meta = load_reward_model(tmp_path / "hf")
    assert verified == [] and meta["model_sha256"] == sha256_file(tmp_path / "hf" / "model.safetensors")
    plain = AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    pairs = random_pairs(5, seed=3)
    chosen, rejected = score_pairs(model, pairs, batch_size=2, layout="packed", pad_token_id=tok.pad_token_id)
    changed = 0
    with torch.no_grad():
        for i, pair in enumerate(pairs):
            for branch, score in ((pair.chosen, chosen[i]), (pair.rejected, rejected[i])):
                ids = torch.tensor([branch.input_ids])
                assert score == pytest.approx(plain(input_ids=ids).logits[0, 0].item(), abs=1e-5)
                changed += abs(score - original(input_ids=ids).logits[0, 0].item()) > 1e-3
    assert changed == 2 * len(pairs)  # the flipped bytes are weights every forward uses


def test_checkpoint_dir_loads_in_transformers_with_the_trained_head(checkpoints):
    """AutoModelForSequenceClassification on a checkpoint dir: every weight loads, no random head."""
    path, trained = checkpoints["tiny-llama"]
    loads = []
    for _ in range(2):
        hf, info = AutoModelForSequenceClassification.from_pretrained(
            path, local_files_only=True, output_loading_info=True, dtype=torch.float32
        )
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
        loads.append(hf.eval())
    assert torch.equal(loads[0].score.weight, trained.head.weight.detach())
    config = json.loads((path / "config.json").read_text())
    tok = builtin_tokenizer()
    assert config["architectures"] == ["LlamaForSequenceClassification"] and len(config["id2label"]) == 1
    assert (config["pad_token_id"], config["bos_token_id"], config["eos_token_id"]) == (
        tok.pad_token_id,
        tok.bos_token_id,
        tok.eos_token_id,
    )
    pair = random_pairs(1, seed=0)[0]
    ids = pair.rejected.input_ids  # score_index is the last token for rejected branches
    with torch.no_grad():
        scores = [m(input_ids=torch.tensor([ids])).logits[0, 0].item() for m in loads]
        mine = trained.eval()(collate([pair]))[1].item()
    assert scores[0] == scores[1] == pytest.approx(mine, abs=1e-5)


def test_checkpoint_of_a_family_that_pools_differently_is_refused_by_transformers(checkpoints):
    path, _ = checkpoints["tiny-bert"]
    with pytest.raises((ValueError, KeyError, OSError)) as err:
        AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True)
    assert "rewardplane-bert" in str(err.value)
    model, _tok, _meta = load_reward_model(path)  # rewardplane itself still loads it
    assert model.head.weight.shape == (1, model.config.hidden_size)


def test_bf16_checkpoint_is_the_model_transformers_loads_in_bf16(checkpoints):
    """`load_reward_model(dtype=bf16)` builds what `from_pretrained(dtype=bf16)` builds, RoPE's
    inverse frequencies included: fp32, as transformers computes them. A `.to(bf16)` rounded them
    to 8 bits, which turns a rotation angle at position p by up to p × 2⁻⁹ rad, and a bf16
    checkpoint then scored unlike a plain transformers forward of itself on long sequences."""
    path, _ = checkpoints["tiny-llama"]
    model, tokenizer, _ = load_reward_model(path, dtype=torch.bfloat16)
    hf = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True, dtype=torch.bfloat16)
    ours = dict(model.backbone.named_buffers())
    for name, buf in hf.model.named_buffers():
        assert ours[name].dtype == buf.dtype and torch.equal(ours[name], buf), name
    params = dict(model.backbone.named_parameters())
    for name, param in hf.model.named_parameters():
        assert params[name].dtype == torch.bfloat16 and torch.equal(params[name], param), name
    assert model.head.weight.dtype == torch.float32  # rewardplane's head stays fp32
    torch.manual_seed(0)
    ids = torch.randint(3, len(tokenizer), (1, 1000))  # long: where rounded frequencies show
    with torch.no_grad():
        ours_h = model.backbone(input_ids=ids).last_hidden_state
        theirs_h = hf.model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(ours_h, theirs_h, atol=0, rtol=0)
