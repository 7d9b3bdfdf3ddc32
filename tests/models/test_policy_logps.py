"""Completion log-probs: padded and packed layouts agree, and both match a plain per-sequence forward."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rewardplane.core.errors import ConfigError
from rewardplane.models import policy
from rewardplane.models.attention import VARLEN
from rewardplane.models.policy import check_policy_semantics, linear_token_logps, sequence_logps, token_logps
from rewardplane.models.tiny import tiny_config

VOCAB = 97


@pytest.fixture(scope="module", params=["sdpa", VARLEN])
def model(request):
    """The same weights under transformers' SDPA and under rewardplane's padding-free attention."""
    torch.manual_seed(0)
    config = tiny_config("tiny-llama", vocab_size=VOCAB)
    config._attn_implementation = request.param
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def sequences():
    """(ids, loss_mask) with varied prompt/completion lengths, including an empty prompt."""
    gen = torch.Generator().manual_seed(1)
    out = []
    for prompt_len, completion_len in [(5, 3), (1, 9), (0, 4), (12, 1), (7, 7)]:
        ids = torch.randint(0, VOCAB, (prompt_len + completion_len,), generator=gen).tolist()
        out.append((ids, [0] * prompt_len + [1] * completion_len))
    return out


def padded(sequences, *, left: bool):
    width = max(len(ids) for ids, _ in sequences)
    n = len(sequences)
    input_ids = torch.zeros(n, width, dtype=torch.long)
    loss_mask = torch.zeros(n, width, dtype=torch.long)
    attention = torch.zeros(n, width, dtype=torch.long)
    segments = torch.full((n, width), -1, dtype=torch.long)
    for row, (ids, mask) in enumerate(sequences):
        cols = slice(width - len(ids), width) if left else slice(0, len(ids))
        input_ids[row, cols] = torch.tensor(ids)
        loss_mask[row, cols] = torch.tensor(mask)
        attention[row, cols] = 1
        segments[row, cols] = row
    return {
        "input_ids": input_ids,
        "loss_mask": loss_mask,
        "segment_ids": segments,
        "attention_mask": attention,
    }


def packed(sequences, *, rows: int):
    """Greedy-pack into `rows` rows, padding each row's tail as its own segment −1."""
    buckets: list[list[int]] = [[] for _ in range(rows)]
    for index in range(len(sequences)):
        buckets[index % rows].append(index)
    width = max(sum(len(sequences[i][0]) for i in bucket) for bucket in buckets) + 2
    input_ids = torch.zeros(rows, width, dtype=torch.long)
    loss_mask = torch.zeros(rows, width, dtype=torch.long)
    positions = torch.zeros(rows, width, dtype=torch.long)
    segments = torch.full((rows, width), -1, dtype=torch.long)
    for row, bucket in enumerate(buckets):
        start = 0
        for index in bucket:
            ids, mask = sequences[index]
            cols = slice(start, start + len(ids))
            input_ids[row, cols] = torch.tensor(ids)
            loss_mask[row, cols] = torch.tensor(mask)
            positions[row, cols] = torch.arange(len(ids))
            segments[row, cols] = index
            start += len(ids)
        positions[row, start:] = torch.arange(width - start)
    return {
        "input_ids": input_ids,
        "loss_mask": loss_mask,
        "segment_ids": segments,
        "position_ids": positions,
    }


def plain_reference(model, sequences, *, average: bool) -> torch.Tensor:
    """One sequence at a time, full-vocabulary log_softmax: the textbook definition."""
    values = []
    with torch.no_grad():
        for ids, mask in sequences:
            logps = model(torch.tensor([ids])).logits[0].log_softmax(-1)
            picked = logps[:-1].gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)
            keep = torch.tensor(mask[1:], dtype=torch.float32)
            total = (picked * keep).sum()
            values.append(total / keep.sum() if average else total)
    return torch.stack(values)


@pytest.mark.parametrize("average", [False, True])
def test_padded_and_packed_layouts_agree_with_plain_forward(model, sequences, average):
    expected = plain_reference(model, sequences, average=average)
    layouts = {
        "right-padded": padded(sequences, left=False),
        "left-padded": padded(sequences, left=True),
        "packed-1-row": packed(sequences, rows=1),
        "packed-2-rows": packed(sequences, rows=2),
    }
    for name, batch in layouts.items():
        with torch.no_grad():
            logps, counts = sequence_logps(model, **batch, num_segments=len(sequences), average=average)
        assert logps.dtype == torch.float32
        # the first token of a sequence has no predecessor, so an empty prompt scores one token fewer
        assert counts.tolist() == [sum(mask[1:]) for _, mask in sequences], name
        torch.testing.assert_close(logps, expected, atol=1e-5, rtol=0, msg=name)


def test_gradients_flow_through_packed_logps(model, sequences):
    model.zero_grad()
    logps, _ = sequence_logps(model, **packed(sequences, rows=1), num_segments=len(sequences))
    logps.sum().backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0
    model.zero_grad()


def test_dropout_is_refused_unless_allowed():
    config = tiny_config("tiny-llama", vocab_size=VOCAB, attention_dropout=0.1)
    model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(ConfigError, match=r"config.attention_dropout=0.1"):
        check_policy_semantics(model, allow_dropout=False)
    check_policy_semantics(model, allow_dropout=True)
    check_policy_semantics(AutoModelForCausalLM.from_config(tiny_config("tiny-llama")), allow_dropout=False)


@pytest.mark.parametrize("chunk_elements", [1 << 26, 3 * 50])  # one chunk; 3 rows per chunk
def test_token_logps_matches_log_softmax_values_and_gradients(monkeypatch, chunk_elements):
    monkeypatch.setattr(policy, "LOGSUMEXP_CHUNK_ELEMENTS", chunk_elements)
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(11, 50, generator=gen, dtype=torch.float64) * 4).requires_grad_()
    labels = torch.randint(0, 50, (11,), generator=gen)
    weights = torch.randn(11, generator=gen, dtype=torch.float64)
    ours = token_logps(logits, labels)
    (grad_ours,) = torch.autograd.grad((ours * weights).sum(), logits)
    plain = torch.log_softmax(logits, -1).gather(-1, labels[:, None]).squeeze(-1)
    (grad_plain,) = torch.autograd.grad((plain * weights).sum(), logits)
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, plain, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_ours, grad_plain, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: token_logps(x, labels), (logits.detach().requires_grad_(),))


def test_token_logps_of_bf16_logits_is_fp32_with_a_bf16_gradient():
    gen = torch.Generator().manual_seed(4)
    logits32 = torch.randn(6, 40, generator=gen) * 3
    labels = torch.randint(0, 40, (6,), generator=gen)
    logits = logits32.bfloat16().requires_grad_()
    ours = token_logps(logits, labels)
    assert ours.dtype == torch.float32
    expected = torch.log_softmax(logits.detach().float(), -1).gather(-1, labels[:, None]).squeeze(-1)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6)
    ours.sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    reference = torch.softmax(logits.detach().float(), -1).neg()
    reference[torch.arange(6), labels] += 1
    torch.testing.assert_close(logits.grad.float(), reference, rtol=0, atol=4e-3)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("chunk_elements", [1 << 26, 3 * 50])
def test_linear_token_logps_matches_the_projected_token_logps(monkeypatch, chunk_elements, with_bias):
    """Values and gradients of hidden, weight and bias equal the unfused projection's."""
    monkeypatch.setattr(policy, "LOGSUMEXP_CHUNK_ELEMENTS", chunk_elements)
    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(11, 8, generator=gen, dtype=torch.float64).requires_grad_()
    weight = torch.randn(50, 8, generator=gen, dtype=torch.float64).requires_grad_()
    bias = torch.randn(50, generator=gen, dtype=torch.float64).requires_grad_() if with_bias else None
    labels = torch.randint(0, 50, (11,), generator=gen)
    weights = torch.randn(11, generator=gen, dtype=torch.float64)
    inputs = (hidden, weight) + ((bias,) if with_bias else ())
    ours = linear_token_logps(hidden, weight, bias, labels)
    grads_ours = torch.autograd.grad((ours * weights).sum(), inputs)
    plain = torch.log_softmax(torch.nn.functional.linear(hidden, weight, bias), -1)
    plain = plain.gather(-1, labels[:, None]).squeeze(-1)
    grads_plain = torch.autograd.grad((plain * weights).sum(), inputs)
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, plain, rtol=0, atol=1e-12)
    for mine, theirs in zip(grads_ours, grads_plain, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-12)
    fused = lambda h, w, *b: linear_token_logps(h, w, b[0] if b else None, labels)  # noqa: E731
    assert torch.autograd.gradcheck(fused, tuple(t.detach().requires_grad_() for t in inputs))


def test_linear_token_logps_under_bf16_autocast_projects_in_bf16():
    """Under autocast the head's matmul is bf16, as `lm_head` would run; the result is fp32."""
    gen = torch.Generator().manual_seed(6)
    hidden = torch.randn(9, 16, generator=gen).requires_grad_()
    weight = torch.randn(40, 16, generator=gen).requires_grad_()
    labels = torch.randint(0, 40, (9,), generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = linear_token_logps(hidden, weight, None, labels)
        plain = token_logps(torch.nn.functional.linear(hidden, weight), labels)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, plain, rtol=0, atol=1e-6)
    ours_grads = torch.autograd.grad(ours.sum(), (hidden, weight))
    plain_grads = torch.autograd.grad(plain.sum(), (hidden, weight))
    for mine, theirs in zip(ours_grads, plain_grads, strict=True):
        assert mine.dtype == torch.float32
        torch.testing.assert_close(mine, theirs, rtol=2e-2, atol=2e-2)


def _tiny_causal_lm(model_type: str, *, tied: bool):
    from transformers import AutoConfig

    torch.manual_seed(7)
    config = AutoConfig.for_model(
        model_type,
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=tied,
    )
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _logps_and_grads(model, batch, num_segments):
    model.zero_grad()
    logps, _ = sequence_logps(model, **batch, num_segments=num_segments)
    logps.square().sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return logps.detach(), grads


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("model_type", sorted(policy.FUSED_HEAD_MODEL_TYPES))
def test_fused_head_equals_the_model_s_own_head(monkeypatch, sequences, model_type, tied):
    """Each listed architecture's logits are exactly lm_head(hidden): fused and unfused log-probs
    and every parameter gradient agree (tied embeddings included), and the fused path ran."""
    model = _tiny_causal_lm(model_type, tied=tied)
    batch = packed(sequences, rows=2)
    calls, head_rows = [], []
    monkeypatch.setattr(policy, "linear_token_logps", lambda *a: calls.append(1) or linear_token_logps(*a))
    handle = model.get_output_embeddings().register_forward_hook(
        lambda _m, _a, out: head_rows.append(out.shape[0])
    )
    fused, fused_grads = _logps_and_grads(model, batch, len(sequences))
    handle.remove()
    assert calls and head_rows == [0], "the fused path did not run, or the head projected states itself"
    monkeypatch.setattr(policy, "FUSED_HEAD_MODEL_TYPES", frozenset())
    plain, plain_grads = _logps_and_grads(model, batch, len(sequences))
    assert len(calls) == 1
    torch.testing.assert_close(fused, plain, rtol=0, atol=1e-5)
    assert fused_grads.keys() == plain_grads.keys()
    for name, grad in fused_grads.items():
        torch.testing.assert_close(grad, plain_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_a_soft_capping_or_adapted_head_is_not_fused():
    """Gemma 2 caps logits after its head, and a LoRA-targeted head is not a plain Linear: both
    keep the general path, which applies whatever the model does after the projection."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig

    config = AutoConfig.for_model(
        "gemma2", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    )  # fmt: skip
    assert config.final_logit_softcapping
    assert policy._output_head(AutoModelForCausalLM.from_config(config))[1] is False
    llama = _tiny_causal_lm("llama", tied=False)
    assert policy._output_head(llama) == (llama.lm_head, True)
    adapted = get_peft_model(llama, LoraConfig(r=2, target_modules=["lm_head", "q_proj"]))
    assert policy._output_head(adapted)[1] is False
