"""Scorer correctness: service scores equal a plain transformers forward, batch invariance, identity."""

from __future__ import annotations

import base64
import io

import httpx
import pytest
import torch

from rewardplane.core.errors import ConfigError
from support.serve import LiveServer, make_config, png_bytes

TOL = 1e-5


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from transformers import AutoModelForSequenceClassification

    from rewardplane.data.builtin_tokenizer import build_tokenizer
    from rewardplane.models.tiny import tiny_config
    from rewardplane.serve.scorers.clip import shape_config, shape_tokenizer

    root = tmp_path_factory.mktemp("models")
    tok = shape_tokenizer()
    torch.manual_seed(1)
    from transformers import CLIPModel

    clip = CLIPModel(shape_config("tiny-clip", tok)).eval()
    clip.save_pretrained(root / "clip")
    tok.save_pretrained(root / "clip")
    rm_tok = build_tokenizer(["hello world, a reward model", "say hi politely"] * 4, vocab_size=300)
    cfg = tiny_config("tiny-llama", vocab_size=len(rm_tok), num_labels=1, pad_token_id=rm_tok.pad_token_id)
    rm = AutoModelForSequenceClassification.from_config(cfg).eval()
    rm.save_pretrained(root / "rm")
    rm_tok.save_pretrained(root / "rm")
    return root


@pytest.fixture(scope="module")
def server(model_dirs):
    cfg = make_config(
        [
            {"name": "clip", "kind": "clip", "path": str(model_dirs / "clip"), "max_batch_size": 16},
            {"name": "rm", "kind": "hf_seqcls", "path": str(model_dirs / "rm"), "max_batch_size": 16},
        ]
    )
    with LiveServer(cfg) as s:
        yield s


IMAGES = [png_bytes((40 + 7 * (k % 3), 30 + 5 * (k % 3)), seed=k) for k in range(6)]  # pairs share a size
PROMPTS = ["a cat", "a painting of a dog", "a cat", "hello world", "a cat", "an astronaut riding a horse"]


def score(server, scorer, items):
    r = httpx.post(server.url + "/v1/score", json={"scorers": [scorer], "items": items}, timeout=60)
    assert r.status_code == 200, r.text
    return [x["scores"][scorer] for x in r.json()["results"]]


def clip_items(idx):
    return [
        {"id": str(k), "prompt": PROMPTS[k], "image": {"b64": base64.b64encode(IMAGES[k]).decode()}}
        for k in idx
    ]


def test_clip_service_equals_plain_transformers_forward(server, model_dirs):
    from PIL import Image
    from transformers import AutoTokenizer, CLIPModel

    from rewardplane.serve.images import Preprocess

    model = CLIPModel.from_pretrained(model_dirs / "clip", local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(model_dirs / "clip", local_files_only=True)
    pre = Preprocess(size=model.config.vision_config.image_size)
    got = score(server, "clip", clip_items(range(6)))
    for k in range(6):
        with Image.open(io.BytesIO(IMAGES[k])) as im:
            arr = torch.from_numpy(__import__("numpy").asarray(im.convert("RGB")).copy()).permute(2, 0, 1)
        enc = tok([PROMPTS[k]], return_tensors="pt")
        with torch.no_grad():
            out = model(
                input_ids=enc["input_ids"],
                attention_mask=enc["attention_mask"],
                pixel_values=pre([arr], "cpu", torch.float32),
            )
        assert abs(out.logits_per_image[0, 0].item() - got[k]) <= TOL


def test_clip_batch_invariance_and_repeated_prompts(server):
    alone = [score(server, "clip", clip_items([k]))[0] for k in range(6)]
    together = score(server, "clip", clip_items(range(6)))
    shuffled = score(server, "clip", clip_items([5, 2, 0, 4, 1, 3]))
    assert max(abs(a - b) for a, b in zip(alone, together, strict=True)) <= TOL
    assert max(abs(alone[k] - s) for k, s in zip([5, 2, 0, 4, 1, 3], shuffled, strict=True)) <= TOL


def test_preprocess_is_close_to_clip_image_processor():
    import numpy as np
    from PIL import Image
    from transformers import CLIPImageProcessor

    from rewardplane.serve.images import Preprocess

    # A smooth photo-like image (resampling kernels differ most on pixel noise, which photos lack).
    y, x = np.mgrid[0:161, 0:243]
    arr = np.stack([127 + 100 * np.sin(x / 17.0), 127 + 100 * np.cos(y / 13.0), x * 255 // 243], -1).astype(
        np.uint8
    )
    ref = CLIPImageProcessor(size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64})(
        images=Image.fromarray(arr), return_tensors="pt"
    )["pixel_values"]
    ours = Preprocess(size=64)([torch.from_numpy(arr.copy()).permute(2, 0, 1)], "cpu", torch.float32)
    assert ours.shape == ref.shape
    diff = (ours - ref).abs()
    assert diff.mean().item() < 0.05 and diff.max().item() < 0.3  # ~2 and ~20 grey levels


RM_ITEMS = [
    {"id": "a", "prompt": "Say hi.", "response": "hi"},
    {
        "id": "b",
        "prompt": [{"role": "user", "content": "hello world"}],
        "response": "a much longer answer " * 5,
    },
    {"id": "c", "prompt": "x", "response": [{"role": "assistant", "content": "polite"}]},
]


def as_conversation(item: dict) -> tuple[list[dict], list[dict]]:
    """An API item's prompt and response as messages, the way the text scorers read them."""
    prompt, response = item["prompt"], item["response"]
    return (
        prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}],
        response if isinstance(response, list) else [{"role": "assistant", "content": response}],
    )


def test_seqcls_service_equals_plain_forward_and_is_batch_invariant(server, model_dirs):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rewardplane.data.tokenize import tokenize_branch

    model = AutoModelForSequenceClassification.from_pretrained(
        model_dirs / "rm", local_files_only=True
    ).eval()
    tok = AutoTokenizer.from_pretrained(model_dirs / "rm", local_files_only=True)
    together = score(server, "rm", RM_ITEMS)
    for k, item in enumerate(RM_ITEMS):
        prompt, response = as_conversation(item)
        # the same ids training and evaluation feed the model (rewardplane.data.tokenize)
        ids = torch.tensor([tokenize_branch(tok, prompt, response).input_ids])
        with torch.no_grad():
            ref = model(input_ids=ids).logits[0, 0].item()
        assert abs(ref - together[k]) <= TOL
        assert abs(score(server, "rm", [item])[0] - together[k]) <= TOL


def test_text_items_that_cannot_be_scored_are_item_errors():
    from rewardplane.serve.protocol import ItemError, ScoreItem
    from rewardplane.serve.scorers.registry import ScorerSpec, build_scorer

    s = build_scorer(
        ScorerSpec(name="t", kind="hf_seqcls", shape="tiny-text-rm", device="cpu", options={"max_length": 40})
    )
    s.load()
    out = s.score_batch(
        [
            ScoreItem("ok", "hi", "hello"),
            ScoreItem("long", "hi", "word " * 200),
            ScoreItem("long-prompt", "word " * 200, "hello"),
        ]
    )
    assert isinstance(out[0], float)
    assert isinstance(out[1], ItemError) and out[1].code == "too_long"
    assert isinstance(out[2], float)  # the oldest prompt tokens are dropped, as in training


def test_identity_is_stable_and_tracks_weights_dtype_and_options(model_dirs, tmp_path):
    from transformers import CLIPModel

    from rewardplane.serve.scorers.registry import ScorerSpec, build_scorer

    def ident(**kw):
        s = build_scorer(ScorerSpec(name="c", kind="clip", device="cpu", **kw))
        s.load()
        return s.info().identity

    base = ident(path=str(model_dirs / "clip"))
    assert base == ident(path=str(model_dirs / "clip"))
    assert base != ident(path=str(model_dirs / "clip"), dtype="bf16")
    assert base != ident(path=str(model_dirs / "clip"), options={"divisor": 100.0})
    assert base != ident(path=str(model_dirs / "clip"), options={"decode": "host"})
    assert base == ident(path=str(model_dirs / "clip"), options={"decode": "device"})
    with pytest.raises(ConfigError, match="options.decode"):
        ident(path=str(model_dirs / "clip"), options={"decode": "gpu"})
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        ident(path=str(model_dirs / "clip"), options={"cuda_graphs": True})
    m = CLIPModel.from_pretrained(model_dirs / "clip")
    with torch.no_grad():
        m.logit_scale.add_(0.1)
    m.save_pretrained(tmp_path / "c2")
    (tmp_path / "c2" / "tokenizer.json").write_bytes((model_dirs / "clip" / "tokenizer.json").read_bytes())
    (tmp_path / "c2" / "tokenizer_config.json").write_bytes(
        (model_dirs / "clip" / "tokenizer_config.json").read_bytes()
    )
    assert base != ident(path=str(tmp_path / "c2"))


def test_pickscore_and_divisor_conventions():
    from rewardplane.serve.protocol import ScoreItem
    from rewardplane.serve.scorers.registry import ScorerSpec, build_scorer

    items = [ScoreItem(str(k), PROMPTS[k], "", IMAGES[k]) for k in range(3)]
    scores = {}
    for kind, opts in (("clip", {}), ("clip", {"divisor": 100.0}), ("pickscore", {})):
        s = build_scorer(ScorerSpec(name="x", kind=kind, shape="tiny-clip", device="cpu", options=opts))
        s.load()
        scores[(kind, opts.get("divisor"))] = s.score_batch(items)
    for a, b, c in zip(
        scores[("clip", None)], scores[("clip", 100.0)], scores[("pickscore", None)], strict=True
    ):
        assert abs(a - c) <= TOL  # pickscore = exp(logit_scale)·cos, same shape and seed
        assert abs(a / 100.0 - b) <= TOL


def test_clip_undecodable_image_inside_batch_is_per_item_bad_image():
    from rewardplane.serve.protocol import ItemError, ScoreItem
    from rewardplane.serve.scorers.registry import ScorerSpec, build_scorer

    s = build_scorer(ScorerSpec(name="x", kind="clip", shape="tiny-clip", device="cpu"))
    s.load()
    out = s.score_batch([ScoreItem("a", "a cat", "", IMAGES[0]), ScoreItem("b", "a cat", "", b"garbage")])
    assert isinstance(out[0], float)
    assert isinstance(out[1], ItemError) and out[1].code == "bad_image"


def test_text_token_budget_caps_padded_batch():
    import asyncio

    from rewardplane.serve.batcher import DynamicBatcher
    from support.serve import DoubleScorer

    scorer = DoubleScorer("d", {})
    DoubleScorer.batches.clear()

    async def run():
        b = DynamicBatcher(scorer, max_batch_size=64, max_wait_ms=20, max_queue=100, token_budget=40)
        b.start()
        from rewardplane.serve.protocol import ScoreItem

        items = [ScoreItem(str(k), "", "x" * (9 if k % 2 else 1)) for k in range(12)]
        out = await b.submit(items)
        await b.stop()
        return out

    out = asyncio.run(run())
    assert out == [9.0 if k % 2 else 1.0 for k in range(12)]
    assert sum(DoubleScorer.batches) == 12 and max(DoubleScorer.batches) <= 4  # 10 tokens x 4 rows = 40


def test_rm_scorer_matches_hf_seqcls_on_a_seqcls_directory(model_dirs):
    """`rm` loads through rewardplane.models.loading (branch rm); on an HF seqcls directory it must
    give exactly the `hf_seqcls` numbers."""
    pytest.importorskip("rewardplane.models.loading")
    from rewardplane.serve.protocol import ScoreItem
    from rewardplane.serve.scorers.registry import ScorerSpec, build_scorer

    items = [ScoreItem(i["id"], i["prompt"], i["response"]) for i in RM_ITEMS]
    scores = {}
    for kind in ("rm", "hf_seqcls"):
        s = build_scorer(ScorerSpec(name="x", kind=kind, path=str(model_dirs / "rm"), device="cpu"))
        s.load()
        scores[kind] = s.score_batch(items)
    assert max(abs(a - b) for a, b in zip(scores["rm"], scores["hf_seqcls"], strict=True)) <= TOL


def test_rm_scorer_on_a_rewardplane_checkpoint_equals_the_eval_scoring_path(tmp_path):
    """Service == evaluation: the same checkpoint, tokenised and scored through rewardplane.models."""
    import json

    from transformers import AutoModel

    from rewardplane.data.builtin_tokenizer import build_tokenizer
    from rewardplane.data.collate import collate
    from rewardplane.data.records import TokenizedPair
    from rewardplane.data.tokenize import tokenize_branch
    from rewardplane.models.loading import load_reward_model, write_model_files
    from rewardplane.models.reward_model import RewardModel
    from rewardplane.models.tiny import tiny_config
    from rewardplane.serve.protocol import ScoreItem
    from rewardplane.serve.scorers.registry import ScorerSpec, build_scorer

    tok = build_tokenizer(["hello world, a reward model", "say hi politely"] * 4, vocab_size=300)
    torch.manual_seed(2)
    backbone = AutoModel.from_config(
        tiny_config("tiny-llama", vocab_size=len(tok), pad_token_id=tok.pad_token_id)
    )
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    write_model_files(ckpt, RewardModel(backbone).state_dict(), backbone.config, tok)
    meta = {
        "format_version": 1,
        "objective": "reward_model",
        "role": "reward_model",
        "head_type": RewardModel.head_type,
    }
    (ckpt / "rewardplane.json").write_text(json.dumps(meta))

    scorer = build_scorer(ScorerSpec(name="rm", kind="rm", path=str(ckpt), device="cpu"))
    scorer.load()
    items = [ScoreItem(i["id"], i["prompt"], i["response"]) for i in RM_ITEMS]
    served = scorer.score_batch(items)
    model, tokenizer, _ = load_reward_model(ckpt)
    for item, got in zip(RM_ITEMS, served, strict=True):
        prompt, response = as_conversation(item)
        branch = tokenize_branch(tokenizer, prompt, response)
        batch = collate([TokenizedPair("p", branch, branch)], pad_token_id=tokenizer.pad_token_id)
        with torch.no_grad():
            ref = model(batch)[0].item()
        assert abs(ref - got) <= TOL
    assert scorer.info().kind == "rm" and len(scorer.info().identity) == 64


def test_graph_bucket_sizes_cover_every_batch_up_to_the_limit():
    from rewardplane.serve.graphs import bucket_sizes

    assert bucket_sizes(1) == [1]
    assert bucket_sizes(16) == [1, 2, 4, 8, 16]
    assert bucket_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert bucket_sizes(100) == [1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 100]
    assert bucket_sizes(12) == [1, 2, 4, 8, 12]
