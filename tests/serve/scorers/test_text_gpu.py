"""On the GPU in bf16, a text scorer's served score is a plain transformers forward's (issue 38).

For every served architecture family at the widths users serve (Qwen2 and Llama at the 0.5B,
1B and 8B widths, 16+ layers, random init as transformers initialises them: std 0.02) and
sequences up to 2,048 tokens: every item's score on every path (padding-free, prefix-shared,
padded) against `AutoModelForSequenceClassification` on the same ids, one sequence at a time,
with issue 38's bar (Pearson r ≥ 0.998, max |diff| ≤ 0.2 × the scores' standard deviation;
a different attention kernel in process gives 0.9991–0.9998). The `rm` scorer on a rewardplane
checkpoint is held to the same bar against `from_pretrained(dtype=bfloat16)` of that checkpoint:
its loader once rounded RoPE's inverse frequencies to bf16, which moved every score.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from rewardplane.models import tiny
from rewardplane.serve.scorers import text

WIDTHS = {  # family → the shape served at each width (qwen2 at 1B/8B: the Llama widths, Qwen2 layers)
    ("qwen2", "0.5b"): ("qwen2-0.5b", {}),
    ("qwen2", "1b"): ("llama-3.2-1b", {"model_type": "qwen2", "num_hidden_layers": 16}),
    ("qwen2", "8b"): ("llama-3.1-8b", {"model_type": "qwen2", "num_hidden_layers": 16}),
    ("llama", "0.5b"): ("qwen2-0.5b", {"model_type": "llama", "num_hidden_layers": 16}),
    ("llama", "1b"): ("llama-3.2-1b", {}),
    ("llama", "8b"): ("llama-3.1-8b", {}),
}


def corpus(vocab: int, seed: int = 0) -> list[list[int]]:
    """Four GRPO groups (one prompt, six responses) and four lone sequences, 24 to 2,048 tokens."""
    rng = random.Random(seed)
    word = lambda: rng.randrange(3, vocab)  # noqa: E731
    seqs = []
    for prompt_len in (40, 300, 900, 1500):
        prompt = [word() for _ in range(prompt_len)]
        seqs += [prompt + [word() for _ in range(rng.randrange(8, 2048 - prompt_len))] for _ in range(6)]
    seqs += [[word() for _ in range(n)] for n in (24, 700, 1300, 2048)]
    return seqs


def check(got: list[float], ref: list[float], what: str) -> None:
    n = len(ref)
    mg, mr = sum(got) / n, sum(ref) / n
    cov = sum((g - mg) * (r - mr) for g, r in zip(got, ref, strict=True))
    pearson = cov / math.sqrt(sum((g - mg) ** 2 for g in got) * sum((r - mr) ** 2 for r in ref))
    std = math.sqrt(sum((r - mr) ** 2 for r in ref) / (n - 1))
    worst = max(abs(g - r) for g, r in zip(got, ref, strict=True))
    assert pearson >= 0.998 and worst <= 0.2 * std, (what, pearson, worst, std)


def one_at_a_time(model, seqs) -> list[float]:
    with torch.inference_mode():
        return [float(model(input_ids=torch.tensor([s], device="cuda")).logits[0, 0]) for s in seqs]


def served_paths(scorer, seqs) -> dict[str, list[float]]:
    out = {}
    for path, attention, share in (
        ("packed", "varlen", False),
        ("shared", "varlen", True),
        ("padded", "padded", False),
    ):
        scorer.attention, scorer.prefix_sharing = attention, share
        out[path] = scorer.score_prepared([list(s) for s in seqs])
    return out


@pytest.mark.gpu
@pytest.mark.parametrize(("family", "width"), list(WIDTHS), ids=[f"{f}-{w}" for f, w in WIDTHS])
def test_served_scores_are_a_plain_transformers_forward_in_bf16(family, width, monkeypatch):
    base, overrides = WIDTHS[(family, width)]
    name = f"{family}-{width}-parity"
    spec = {**tiny.TINY_CONFIGS[base], **overrides}
    monkeypatch.setitem(tiny.TINY_CONFIGS, name, spec)
    monkeypatch.setattr(text.SeqClsScorer, "shapes", (*text.TEXT_SHAPES, name))
    scorer = text.SeqClsScorer("rm", shape=name, dtype="bf16", device="cuda")
    scorer.load()
    assert scorer.attention == "varlen" and scorer.model.config.model_type == family
    assert scorer.model.config.num_hidden_layers >= 16
    seqs = corpus(2000)
    scorer.model.set_attn_implementation("sdpa")
    ref = one_at_a_time(scorer.model, seqs)
    scorer.backbone.set_attn_implementation("rk_varlen")
    for path, got in served_paths(scorer, seqs).items():
        check(got, ref, path)


@pytest.mark.gpu
def test_a_bf16_checkpoint_is_served_as_transformers_loads_it(tmp_path):
    """`rm` on a rewardplane checkpoint (Llama at the 1B width, 16 layers) against
    `from_pretrained(dtype=bfloat16)` of the same directory."""
    from transformers import AutoModel, AutoModelForSequenceClassification

    from rewardplane.data.synth import builtin_tokenizer
    from rewardplane.models.loading import write_model_files, write_reward_model_metadata
    from rewardplane.models.reward_model import RewardModel

    tok = builtin_tokenizer()
    config = tiny.tiny_config("llama-3.2-1b", vocab_size=len(tok), pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = RewardModel(AutoModel.from_config(config, dtype=torch.float32))
    write_model_files(tmp_path, {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}, config, tok)
    write_reward_model_metadata(tmp_path, score_position="template_end", plain_text="chat_template")
    del model
    scorer = text.RewardModelScorer("rm", path=str(tmp_path), dtype="bf16", device="cuda")
    scorer.load()
    assert scorer.attention == "varlen"
    rope = dict(scorer.model.backbone.named_buffers())["rotary_emb.inv_freq"]
    assert rope.dtype == torch.float32  # as transformers keeps it, whatever the weights' dtype
    hf = AutoModelForSequenceClassification.from_pretrained(tmp_path, dtype=torch.bfloat16).to("cuda").eval()
    seqs = corpus(len(tok), seed=1)
    ref = one_at_a_time(hf, seqs)
    for path, got in served_paths(scorer, seqs).items():
        check(got, ref, path)
