"""`rewardplane eval`'s reward-model scorer (`reward_model.load_scorer`) scores through
models/packed_scoring.score_sequences and still equals a plain transformers forward of each
branch alone, for Llama- and Qwen2-shaped classifiers and for legacy end-of-turn checkpoints."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rewardplane.data.collate import collate
from rewardplane.data.records import TokenizedBranch, TokenizedPair
from rewardplane.data.synth import builtin_tokenizer, generate_rows
from rewardplane.data.tokenize import TokenizeSettings
from rewardplane.eval.runner import tokenize_eval_data
from rewardplane.objectives.reward_model import load_scorer
from support.seqcls import plain_scores, seqcls

torch.set_num_threads(1)


def eval_pairs(tmp_path, tokenizer, n: int = 24) -> list[TokenizedPair]:
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in generate_rows(n, seed=5)))
    pairs = tokenize_eval_data(data, tokenizer, TokenizeSettings())
    # a branch ending in pad tokens (pad == eos tokenizers): HF reads at the last non-pad token
    pad = tokenizer.pad_token_id
    first = pairs[0].chosen
    tail = TokenizedBranch([*first.input_ids, pad, pad], [*first.loss_mask, 1, 1], first.score_index + 2)
    return [*pairs, TokenizedPair("padded-tail", tail, pairs[1].rejected)]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_eval_scores_equal_a_plain_forward_with_far_less_padding(family, tmp_path):
    tokenizer = builtin_tokenizer()
    model = seqcls(family, vocab=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    pairs = eval_pairs(tmp_path, tokenizer)
    # a budget this small lets the 50 branches form several length buckets
    scorer = load_scorer(tmp_path / "model", device="cpu", max_batch_tokens=1024)
    chosen, rejected, losses = scorer.score(pairs, 16)
    assert losses is None
    plain = plain_scores(model, [p.chosen.input_ids for p in pairs] + [p.rejected.input_ids for p in pairs])
    np.testing.assert_allclose(np.concatenate([chosen, rejected]), plain.numpy(), atol=1e-5, rtol=0)
    assert np.ptp(chosen) > 1e-3  # a model scoring everything alike would pass trivially
    assert scorer.scoring["attention"] == "padded" and scorer.scoring["path"].startswith("padded")
    # right-padded batches of 16 pairs in data order, as eval scored before
    before = sum(
        collate(pairs[k : k + 16], layout="right", pad_token_id=0).input_ids.numel()
        for k in range(0, len(pairs), 16)
    )
    real = scorer.scoring["real_tokens"]
    assert scorer.scoring["padding_tokens"] < 0.5 * (before - real)
    # the benchmark path scores the same branches on their own
    alone = scorer.score_branches([p.chosen for p in pairs])
    np.testing.assert_allclose(alone, chosen, atol=1e-5, rtol=0)


def test_legacy_end_of_turn_checkpoint_reads_where_its_forward_reads(tmp_path):
    """Checkpoints trained before score_position was recorded step back over trailing template
    whitespace; the cut branches must be read at that same token."""
    from rewardplane.core.atomic import write_json
    from rewardplane.models.loading import FORMAT_VERSION, METADATA_FILE, load_reward_model, write_model_files
    from rewardplane.models.reward_model import RewardModel, build_backbone
    from rewardplane.objectives.base import score_in_batches
    from rewardplane.objectives.reward_model import _score_batch

    tokenizer = builtin_tokenizer()
    torch.manual_seed(0)
    model = RewardModel(build_backbone({"tiny": "tiny-llama"}, vocab_size=len(tokenizer)))
    write_model_files(tmp_path, model.state_dict(), model.config, tokenizer)
    write_json(tmp_path / METADATA_FILE, {"format_version": FORMAT_VERSION, "objective": "reward_model",
               "role": "reward_model", "head_type": RewardModel.head_type, "attn_implementation": "sdpa"})  # fmt: skip
    newline = tokenizer.convert_tokens_to_ids(tokenizer.tokenize("\n"))[-1]
    pairs = eval_pairs(tmp_path, tokenizer, n=8)
    pairs = [
        TokenizedPair(p.pair_id, b, p.rejected)
        for p in pairs
        for b in [TokenizedBranch([*p.chosen.input_ids, newline, newline], [*p.chosen.loss_mask, 1, 1], len(p.chosen) + 1)]
    ]  # fmt: skip
    scorer = load_scorer(tmp_path, device="cpu")
    ours = scorer.score(pairs, 4)
    own, _, meta = load_reward_model(tmp_path)
    assert meta["score_position"] == "end_of_turn"
    forward = score_in_batches(own, pairs, 4, _score_batch)
    np.testing.assert_allclose(ours[0], forward[0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(ours[1], forward[1], atol=1e-5, rtol=0)
    # read positions stepped back over the newlines: the branches were cut there before scoring
    assert scorer.scoring["real_tokens"] <= sum(len(p.chosen) + len(p.rejected) for p in pairs) - 2 * len(
        pairs
    )


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_bf16_eval_on_cuda_is_packed_and_matches_a_plain_forward(family, tmp_path):
    tokenizer = builtin_tokenizer()
    model = seqcls(family, vocab=len(tokenizer), pad_token_id=tokenizer.pad_token_id).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    pairs = eval_pairs(tmp_path, tokenizer)
    scorer = load_scorer(tmp_path / "model", device="cuda", dtype="bf16")
    chosen, rejected, _ = scorer.score(pairs, 16)
    assert scorer.scoring["attention"] == "varlen" and scorer.scoring["shared_tokens"] > 0
    assert scorer.scoring["padding_tokens"] == 0
    plain = plain_scores(
        model.to("cuda"), [p.chosen.input_ids for p in pairs] + [p.rejected.input_ids for p in pairs]
    )
    np.testing.assert_allclose(np.concatenate([chosen, rejected]), plain.numpy(), atol=2e-2, rtol=0)
