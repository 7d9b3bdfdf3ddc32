"""Padding-free attention (`rk_varlen`): boundaries, per-sequence semantics, and layout parity."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rewardplane.data.collate import collate
from rewardplane.models import attention
from rewardplane.models.attention import VARLEN, packed_attention, resolve_attn_implementation
from rewardplane.models.reward_model import RewardModel, build_backbone
from support.rm import VOCAB, random_pairs


class _Config:
    _attn_implementation = VARLEN


def test_boundaries_come_from_restarting_positions():
    # row 0: sequences of 3 and 2 tokens, then 1 pad slot; row 1: one sequence of 6
    positions = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]])
    with packed_attention(_Config(), positions) as kwargs:
        assert attention._BOUNDARIES_GIVEN.get()
    assert not attention._BOUNDARIES_GIVEN.get()
    assert kwargs["cu_seq_lens_q"].tolist() == [0, 3, 5, 6, 12]
    assert kwargs["cu_seq_lens_q"].dtype == torch.int32
    assert kwargs["max_length_q"] == kwargs["max_length_k"] == 6
    sdpa = type("C", (), {"_attn_implementation": "sdpa"})()
    with packed_attention(sdpa, positions) as kwargs:
        assert kwargs == {} and not attention._BOUNDARIES_GIVEN.get()


def test_auto_resolves_to_sdpa_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_attn_implementation("auto") == resolve_attn_implementation(None) == "sdpa"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_attn_implementation("auto") == VARLEN
    assert resolve_attn_implementation("eager") == "eager"


@pytest.mark.parametrize("causal", [True, False])
def test_per_sequence_attention_equals_a_block_diagonal_mask(causal):
    gen = torch.Generator().manual_seed(0)
    lengths = [5, 1, 7, 3]
    total, heads, kv_heads, dim = sum(lengths), 4, 2, 8
    q = torch.randn(total, heads, dim, generator=gen)
    k = torch.randn(total, kv_heads, dim, generator=gen)
    v = torch.randn(total, kv_heads, dim, generator=gen)
    cu = torch.tensor([0, 5, 6, 13, 16], dtype=torch.int32)
    out = attention._per_sequence(q, k, v, cu, cu, None, causal)
    segment = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    mask = segment[:, None] == segment[None, :]
    if causal:
        mask &= torch.ones(total, total, dtype=torch.bool).tril()
    expected = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.repeat_interleave(2, dim=1).transpose(0, 1),
        v.repeat_interleave(2, dim=1).transpose(0, 1),
        attn_mask=mask,
    ).transpose(0, 1)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


def test_reward_scores_match_sdpa_in_every_layout(monkeypatch):
    calls = []
    real = attention._per_sequence
    monkeypatch.setattr(attention, "_per_sequence", lambda *a: calls.append(1) or real(*a))
    torch.manual_seed(0)
    reference = RewardModel(build_backbone({"tiny": "tiny-llama"}, vocab_size=VOCAB)).eval()
    varlen = RewardModel(
        build_backbone({"tiny": "tiny-llama", "attn_implementation": VARLEN}, vocab_size=VOCAB)
    )
    varlen.load_state_dict(reference.state_dict())
    varlen.eval()
    assert varlen.config._attn_implementation == VARLEN
    pairs = random_pairs(9, seed=4)
    with torch.no_grad():
        expected = reference(collate(pairs, layout="right"))
        for layout in ("right", "left", "packed"):
            got = varlen(collate(pairs, layout=layout, max_length=32))
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=0, msg=layout)
            # padded layouts use transformers' SDPA; packed rows take the boundary path in every layer
            assert len(calls) == (varlen.config.num_hidden_layers if layout == "packed" else 0), layout
            calls.clear()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flash_kernel_matches_per_sequence_reference_on_cuda(dtype):
    if attention._VARLEN_ATTN is None:
        pytest.fail("this torch has no torch.nn.attention.varlen")
    gen = torch.Generator(device="cuda").manual_seed(0)
    total, heads, kv_heads, dim = 300, 14, 2, 64
    q, k, v = (
        torch.randn(total, h, dim, device="cuda", dtype=dtype, generator=gen)
        for h in (heads, kv_heads, kv_heads)
    )
    cu = torch.tensor([0, 40, 41, 200, 300], dtype=torch.int32, device="cuda")
    flash = attention._flash(q, k, v, cu, cu, 159, 159, None, True)
    exact = attention._per_sequence(q.float(), k.float(), v.float(), cu, cu, None, True)
    torch.testing.assert_close(flash.float(), exact, atol=2e-2, rtol=0)


def test_per_sequence_attention_with_more_keys_than_queries_is_bottom_right_causal():
    """A sequence whose queries are the last of its keys (a shared prompt prefix read from another
    span) attends exactly as the same queries would inside the full sequence."""
    gen = torch.Generator().manual_seed(1)
    heads, kv_heads, dim = 4, 2, 8
    full = 9  # a prefix of 5 keys, then 4 query positions
    q = torch.randn(full, heads, dim, generator=gen)
    k = torch.randn(full, kv_heads, dim, generator=gen)
    v = torch.randn(full, kv_heads, dim, generator=gen)
    whole = attention._per_sequence(q, k, v, *(torch.tensor([0, full], dtype=torch.int32),) * 2, None, True)
    tail = attention._per_sequence(
        q[5:],
        k,
        v,
        torch.tensor([0, 4], dtype=torch.int32),
        torch.tensor([0, full], dtype=torch.int32),
        None,
        True,
    )
    torch.testing.assert_close(tail, whole[5:], atol=1e-6, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flash_kernel_with_more_keys_than_queries_matches_the_reference(dtype):
    """Shared prefixes rely on flash-attention aligning causality bottom-right when a sequence
    has more keys than queries; the per-sequence reference defines that alignment."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    heads, kv_heads, dim = 14, 2, 64
    q = torch.randn(60, heads, dim, device="cuda", dtype=dtype, generator=gen)
    k, v = (torch.randn(150, kv_heads, dim, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    cu_q = torch.tensor([0, 20, 21, 60], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 50, 71, 150], dtype=torch.int32, device="cuda")
    flash = attention._flash(q, k, v, cu_q, cu_k, 39, 79, None, True)
    exact = attention._per_sequence(q.float(), k.float(), v.float(), cu_q, cu_k, None, True)
    torch.testing.assert_close(flash.float(), exact, atol=2e-2, rtol=0)


@pytest.mark.parametrize(
    ("grad", "compiling", "route"),
    [(False, False, "kernel"), (True, False, "op"), (False, True, "op")],
    ids=["scoring", "training", "compiled"],
)
def test_only_uncompiled_scoring_calls_the_kernel_directly(grad, compiling, route, monkeypatch):
    """The direct call skips autograd, so anything that may differentiate, and compiled graphs
    (which trace the custom op), go through torch's `varlen_attn`."""
    taken = []
    monkeypatch.setattr(attention, "_flash_kernel", lambda *a: taken.append("kernel") or a[0])
    monkeypatch.setattr(attention, "_VARLEN_ATTN", lambda q, *a, **k: taken.append("op") or q)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    q = torch.randn(6, 4, 8, requires_grad=grad)
    k = v = torch.randn(6, 4, 8)
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    attention._flash(q, k, v, cu, cu, 4, 4, None, True)
    assert taken == [route]


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_scoring_calls_the_kernel_directly_and_matches_the_differentiable_op(causal, monkeypatch):
    """Without autograd `_flash` skips torch's custom-op wrapper and the repeated k/v heads; with
    it (training) it keeps the op, which can differentiate. Both give the same attention."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(60, 14, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(150, 2, 64, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    cu_q = torch.tensor([0, 20, 21, 60], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 50, 71, 150], dtype=torch.int32, device="cuda")
    differentiable = attention._flash(q.requires_grad_(), k, v, cu_q, cu_k, 39, 79, None, causal)
    differentiable.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
    monkeypatch.setattr(attention, "_VARLEN_ATTN", None)  # the wrapper must not be reached
    with torch.no_grad():
        direct = attention._flash(q, k, v, cu_q, cu_k, 39, 79, None, causal)
    torch.testing.assert_close(direct, differentiable.detach(), atol=0, rtol=0)


def test_varlen_models_pack_a_micro_batch_into_one_unpadded_row(monkeypatch):
    from transformers import masking_utils

    import rewardplane.models.attention as attn_module

    built = []
    real_mask = masking_utils.sdpa_mask
    monkeypatch.setattr(masking_utils, "sdpa_mask", lambda *a, **k: built.append(1) or real_mask(*a, **k))
    attn_module.register()  # re-wrap the patched sdpa_mask
    torch.manual_seed(0)
    model = RewardModel(
        build_backbone({"tiny": "tiny-llama", "attn_implementation": VARLEN}, vocab_size=VOCAB)
    )
    model.eval()
    pairs = random_pairs(9, seed=7)
    one_row = collate(
        pairs, layout="packed", max_length=32, row_length=attention.packed_row_length(model.config, 32)
    )
    assert one_row.input_ids.shape[0] == 1 and one_row.padding_efficiency == 1.0
    with torch.no_grad():
        got = model(one_row)
        assert built == []  # boundaries given: no T x T mask is built
        expected = model(collate(pairs, layout="right"))
        assert built  # the padded batch still gets SDPA's mask
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    sdpa = type("C", (), {"_attn_implementation": "sdpa"})()
    assert attention.packed_row_length(sdpa, 32) == 32


def test_autocast_brings_rotary_promoted_inputs_back_to_the_autocast_dtype():
    # Rotary embeddings multiply bf16 projections by fp32 cos/sin; q and k arrive in fp32.
    q, k = torch.randn(5, 2, 4), torch.randn(5, 1, 4)
    v = torch.randn(5, 1, 4, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = attention._autocast_inputs(q, k, v)
    assert [t.dtype for t in cast] == [torch.bfloat16] * 3
    assert [t.dtype for t in attention._autocast_inputs(q, k, v)] == [
        torch.float32,
        torch.float32,
        torch.bfloat16,
    ]


@pytest.mark.gpu
def test_bf16_autocast_training_forward_takes_the_flash_kernel(monkeypatch):
    def refuse(*_args):
        raise AssertionError("fell back to per-sequence attention")

    monkeypatch.setattr(attention, "_per_sequence", refuse)
    torch.manual_seed(0)
    model = RewardModel(
        build_backbone({"tiny": "tiny-llama", "attn_implementation": VARLEN}, vocab_size=VOCAB)
    ).cuda()
    batch = collate(random_pairs(6, seed=2), layout="packed", row_length=10_000).to("cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        scores = model(batch)
    scores.sum().backward()
    assert torch.isfinite(scores).all()
