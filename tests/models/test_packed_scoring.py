"""Packed (padding-free) and prefix-shared scoring equal a plain transformers forward, per sequence."""

from __future__ import annotations

import random

import pytest
import torch

from rewardplane.models.packed_scoring import (
    budget_chunks,
    length_buckets,
    packed_scores,
    padded_scores,
    plan_packed,
    score_sequence_chunks,
    score_sequences,
)
from support.seqcls import VOCAB, plain_scores, seqcls


def corpus(seed: int = 0) -> list[list[int]]:
    """Three GRPO-style groups (one prompt, four responses) and two lone sequences."""
    rng = random.Random(seed)
    seqs = []
    for _ in range(3):
        prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randrange(20, 40))]
        seqs += [prompt + [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 30))] for _ in range(4)]
    seqs += [[rng.randrange(1, VOCAB) for _ in range(n)] for n in (5, 33)]
    rng.shuffle(seqs)
    return seqs


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("share", [False, True], ids=["varlen", "shared-prefix"])
def test_packed_scores_equal_a_plain_forward(family, share):
    seqs = corpus()
    plain = plain_scores(seqcls(family, "sdpa"), seqs)
    model = seqcls(family, "rk_varlen")
    plan = plan_packed(seqs, share_prefixes=share, min_prefix=8)
    with torch.no_grad():
        packed = packed_scores(model.base_model, model.score, plan)
    torch.testing.assert_close(packed, plain, atol=1e-5, rtol=0)
    if share:
        assert plan.shared_groups == 3 and plan.saved_tokens > 0
    else:
        assert plan.computed_tokens == sum(map(len, seqs)) and plan.kv_index is None


def test_a_score_does_not_depend_on_what_it_is_packed_with():
    model = seqcls("llama", "rk_varlen")
    seqs = corpus()
    with torch.no_grad():
        alone = torch.stack(
            [packed_scores(model.base_model, model.score, plan_packed([s])) for s in seqs]
        ).reshape(-1)
        together = packed_scores(model.base_model, model.score, plan_packed(seqs, share_prefixes=True))
        reordered = packed_scores(model.base_model, model.score, plan_packed(seqs[::-1], share_prefixes=True))
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(reordered.flip(0), alone, atol=1e-5, rtol=0)


def test_padded_buckets_equal_a_plain_forward():
    model = seqcls("llama", "sdpa")
    seqs = corpus()

    def forward(input_ids, attention_mask, lengths):
        return model(input_ids=input_ids, attention_mask=attention_mask).logits[:, 0]

    with torch.no_grad():
        scores, slots = padded_scores(forward, seqs, pad_token_id=0, max_batch_tokens=200, device="cpu")
    torch.testing.assert_close(scores, plain_scores(model, seqs), atol=1e-5, rtol=0)
    buckets = length_buckets([len(s) for s in seqs], 200)
    assert slots == sum(len(b) * max(len(seqs[i]) for i in b) for b in buckets)


def test_prefix_groups_keep_a_token_of_their_own_and_need_the_minimum():
    prompt = list(range(1, 21))
    seqs = [prompt + [50], prompt + [60, 61], prompt[:10] + [70], [1, 2, 3]]
    plan = plan_packed(seqs, share_prefixes=True, min_prefix=8)
    # the three sequences sharing 10+ tokens form one group with the 10 common tokens packed once
    assert plan.shared_groups == 1
    assert plan.computed_tokens == 10 + (11 + 12 + 1) + 3
    ends = plan.input_ids[0, plan.score_at].tolist()
    assert ends == [50, 61, 70, 3]
    assert plan_packed(seqs, share_prefixes=True, min_prefix=11).shared_groups == 1  # prompt+[50], +[60,61]
    with pytest.raises(ValueError):
        plan_packed([[1], []])


def test_prefix_groups_share_each_prompt_past_a_common_system_prompt():
    """A system prompt common to all sequences must not swallow the groups: each prompt's four
    responses share system prompt + prompt (3 × 3 × 50 tokens saved), not all twelve the system
    prompt alone (11 × 20)."""
    system = list(range(1, 21))
    prompts = [[30 + g] * 30 for g in range(3)]
    seqs = [system + p + [80 + r, 90] for p in prompts for r in range(4)]
    random.Random(0).shuffle(seqs)
    plan = plan_packed(seqs, share_prefixes=True, min_prefix=16)
    assert plan.shared_groups == 3
    assert plan.saved_tokens == 3 * 3 * 50


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_score_sequences_packed_and_padded_equal_a_plain_forward(family):
    """The entry serve and eval share: input order kept (the shared path packs in token order),
    several forwards under a small budget, and the token accounting of each path."""
    seqs = corpus()
    plain = plain_scores(seqcls(family, "sdpa"), seqs)
    model = seqcls(family, "rk_varlen")
    with torch.no_grad():
        packed, packed_tokens = score_sequences(
            seqs, varlen=True, max_batch_tokens=150, backbone=model.base_model, head=model.score,
            share_prefixes=True, min_prefix=8,
        )  # fmt: skip
        padded, padded_tokens = score_sequences(
            seqs, varlen=False, max_batch_tokens=150, backbone=model.base_model, head=model.score
        )
    torch.testing.assert_close(packed, plain, atol=1e-5, rtol=0)
    torch.testing.assert_close(padded, plain, atol=1e-5, rtol=0)
    real = sum(map(len, seqs))
    assert packed_tokens["real"] == padded_tokens["real"] == real
    assert packed_tokens["padding"] == 0 and packed_tokens["shared"] > 0
    assert packed_tokens["computed"] == real - packed_tokens["shared"]
    assert padded_tokens["computed"] == real + padded_tokens["padding"] and padded_tokens["shared"] == 0


@pytest.mark.parametrize("varlen", [True, False], ids=["packed", "padded"])
def test_chunks_arriving_one_by_one_score_as_the_whole_list_in_their_order(varlen):
    """The streaming entry eval feeds from its tokenising thread: scores in arrival order equal
    the one-call scores whatever the chunking (a partial budget is carried into the next chunk),
    every forward within the budget, and one chunk packs exactly as `score_sequences`."""
    seqs = corpus() + corpus(seed=1)
    model = seqcls("qwen2", "rk_varlen" if varlen else "sdpa")
    kw = dict(varlen=varlen, max_batch_tokens=150, backbone=model.base_model, head=model.score,
              share_prefixes=varlen, min_prefix=8)  # fmt: skip
    forwards: list[int] = []
    with torch.no_grad():
        whole, whole_tokens = score_sequences(seqs, **kw)
        one, _ = score_sequence_chunks([seqs], **kw)
        cuts = [0, 1, 4, 11, 12, len(seqs)]
        chunked, tokens = score_sequence_chunks(
            (seqs[a:b] for a, b in zip(cuts, cuts[1:], strict=False)), on_scored=forwards.append, **kw
        )
    assert torch.equal(one, whole)
    torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=0)
    torch.testing.assert_close(chunked, plain_scores(seqcls("qwen2", "sdpa"), seqs), atol=1e-5, rtol=0)
    assert sum(forwards) == len(seqs) and tokens["real"] == whole_tokens["real"]
    if varlen:  # the carried partial budget keeps forwards full: no more of them than chunks need
        assert len(forwards) <= len(budget_chunks([len(s) for s in sorted(seqs)], 150)) + len(cuts) - 2
        assert tokens["shared"] > 0 and tokens["computed"] == tokens["real"] - tokens["shared"]


@pytest.mark.parametrize("share", [False, True])
def test_each_sequence_reads_back_from_its_span_keys_with_positions_from_zero(share):
    """The plan's layout, checked token by token: a sequence's last span gathers (through
    `kv_index`, or its own span without sharing) exactly the sequence's ids at positions
    0..n-1, and its score is read at its last token. Lists and numpy arrays plan alike."""
    import numpy as np

    seqs = corpus(3)
    plan = plan_packed(seqs, share_prefixes=share, min_prefix=8)
    as_arrays = plan_packed([np.asarray(s) for s in seqs], share_prefixes=share, min_prefix=8)
    for field in ("input_ids", "position_ids", "cu_q", "cu_k", "score_at"):
        assert torch.equal(getattr(plan, field), getattr(as_arrays, field))
    ids, pos = plan.input_ids[0], plan.position_ids[0]
    assert plan.shared_groups == (3 if share else 0)
    for i, seq in enumerate(seqs):
        end = int(plan.score_at[i])
        span = int(torch.searchsorted(plan.cu_q[1:].long(), end, right=True))
        keys = (
            plan.kv_index[plan.cu_k[span] : plan.cu_k[span + 1]]
            if plan.kv_index is not None
            else torch.arange(int(plan.cu_q[span]), int(plan.cu_q[span + 1]))
        )
        assert ids[keys].tolist() == seq and pos[keys].tolist() == list(range(len(seq)))
        assert int(keys[-1]) == end == int(plan.cu_q[span + 1]) - 1


def test_length_buckets_respect_the_token_budget():
    lengths = [5, 50, 7, 300, 6, 49]
    buckets = length_buckets(lengths, 100)
    assert sorted(i for b in buckets for i in b) == list(range(6))
    for b in buckets:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 100
    assert [3] in buckets  # longer than the budget: alone


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_flash_packed_and_shared_scores_match_a_plain_bf16_forward_on_cuda(family):
    torch.manual_seed(0)
    model = seqcls(family, "sdpa").to("cuda", torch.bfloat16)
    seqs = corpus()
    plain = torch.tensor(
        [float(model(input_ids=torch.tensor([s], device="cuda")).logits[0, 0]) for s in seqs]
    )
    model.set_attn_implementation("rk_varlen")
    with torch.no_grad():
        packed = packed_scores(model.base_model, model.score, plan_packed(seqs)).float().cpu()
        shared = packed_scores(
            model.base_model, model.score, plan_packed(seqs, share_prefixes=True, min_prefix=8)
        )
    torch.testing.assert_close(packed, plain, atol=2e-2, rtol=0)
    torch.testing.assert_close(shared.float().cpu(), packed, atol=1e-3, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("share", [False, True], ids=["varlen", "shared-prefix"])
def test_a_packed_batch_never_synchronises_the_stream_until_its_scores_are_read(share):
    """The text scorers queue a second batch behind the first from another thread: a stream sync
    inside the first (a pageable copy, `.item()`, `.cpu()`) would make the GPU wait for the host
    again. `to_host` waits on an event recorded after its own copy, which is not a stream sync."""
    torch.manual_seed(0)
    model = seqcls("llama", "rk_varlen").to("cuda", torch.bfloat16)
    seqs = corpus()
    args = dict(varlen=True, max_batch_tokens=64, backbone=model.base_model, head=model.score,
                device="cuda", share_prefixes=share, min_prefix=8)  # fmt: skip
    with torch.inference_mode():
        expected, _ = score_sequences(seqs, **args)
        torch.cuda.set_sync_debug_mode("error")
        try:
            scores, _ = score_sequences(seqs, **args)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(scores, expected, atol=0, rtol=0)


@pytest.mark.gpu
def test_two_threads_scoring_at_once_give_the_scores_of_one():
    from concurrent.futures import ThreadPoolExecutor

    torch.manual_seed(0)
    model = seqcls("qwen2", "rk_varlen").to("cuda", torch.bfloat16)
    batches = [corpus(seed) for seed in range(8)]

    def score(seqs):
        with torch.inference_mode():
            return score_sequences(seqs, varlen=True, max_batch_tokens=96, backbone=model.base_model,
                                   head=model.score, device="cuda")[0]  # fmt: skip

    alone = [score(b) for b in batches]
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(score, batches))
    for a, b in zip(alone, together, strict=True):
        torch.testing.assert_close(b, a, atol=0, rtol=0)


def test_a_packed_forward_never_asks_transformers_to_find_packed_sequences(monkeypatch):
    """That search reads a device value back to the host (a stream sync on CUDA): the packed
    forward hands transformers a prepared mask instead, so it never runs."""
    import transformers.masking_utils as masking

    def refuse(*_args, **_kwargs):
        raise AssertionError("find_packed_sequence_indices was called")

    monkeypatch.setattr(masking, "find_packed_sequence_indices", refuse)
    seqs = corpus()
    plain = plain_scores(seqcls("qwen2", "sdpa"), seqs)  # each sequence alone, no padding
    model = seqcls("qwen2", "rk_varlen")
    with torch.no_grad():
        for share in (False, True):
            plan = plan_packed(seqs, share_prefixes=share, min_prefix=8)
            scores = packed_scores(model.base_model, model.score, plan)
            torch.testing.assert_close(scores, plain, atol=1e-5, rtol=0)  # the prepared mask is right


@pytest.mark.parametrize("shared_lock", [True, False], ids=["one-lock", "no-lock"])
def test_threads_sharing_a_launch_lock_queue_their_forwards_one_at_a_time(shared_lock, monkeypatch):
    """Batches in flight on one stream must not interleave their kernels (see score_sequence_chunks):
    with the lock the launches never overlap; without it (the control) they do."""
    import threading
    import time

    from rewardplane.models import packed_scoring

    real = packed_scoring.packed_scores
    active, most, guard = [0], [0], threading.Lock()

    def slow_launch(*args):
        with guard:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.05)
        try:
            return real(*args)
        finally:
            with guard:
                active[0] -= 1

    monkeypatch.setattr(packed_scoring, "packed_scores", slow_launch)
    model = seqcls("llama", "rk_varlen")
    lock = threading.Lock() if shared_lock else None
    start = threading.Barrier(2)
    got: list[torch.Tensor] = []

    def score():
        start.wait()
        with torch.no_grad():
            scores, _ = score_sequences(
                corpus(), varlen=True, max_batch_tokens=10_000, backbone=model.base_model,
                head=model.score, launch_lock=lock,
            )  # fmt: skip
        got.append(scores)

    threads = [threading.Thread(target=score) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == (1 if shared_lock else 2)
    torch.testing.assert_close(got[0], got[1], atol=0, rtol=0)


def test_forwards_on_one_stream_share_a_launch_lock_and_other_streams_do_not(monkeypatch):
    """The default lock is the stream's: every thread and scorer queuing on one stream shares it;
    a stream of its own (a consolidated worker's scorer) has its own; off CUDA there is none."""
    from types import SimpleNamespace

    from rewardplane.models.packed_scoring import stream_launch_lock

    current = {"stream": SimpleNamespace(device=SimpleNamespace(index=0), cuda_stream=7)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current["stream"])
    first, again = stream_launch_lock("cuda:0"), stream_launch_lock("cuda:0")
    current["stream"] = SimpleNamespace(device=SimpleNamespace(index=0), cuda_stream=8)
    other = stream_launch_lock("cuda:0")
    assert first is again and first is not other
    assert hasattr(first, "acquire") and hasattr(other, "acquire")
    assert not hasattr(stream_launch_lock("cpu"), "acquire")  # a null context
