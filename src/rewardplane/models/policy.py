"""Sequence log-probabilities of completions under a causal LM, for padded and packed batches.

DPO compares log π(completion | prompt) between two completions and two models, so the
quantity must not depend on how a batch was laid out. Both layouts go through one function:

- **padded**: `input_ids` [B, T] with an `attention_mask`; one sequence per row.
- **packed**: several sequences concatenated in a row, `attention_mask=None` and
  `position_ids` restarting at 0 for each sequence. transformers turns restarting position ids
  into a block-diagonal causal mask, so sequences never attend to each other.

`segment_ids` [B, T] names the sequence each token belongs to (−1 for padding). Token t is
scored when `loss_mask[t] == 1` and token t−1 belongs to the same sequence, so a completion
token is never predicted from the end of the previous packed sequence.

Sequence log-probs are **sums** over completion tokens (the DPO likelihood). IPO is defined on
length-normalised log-probs, so `average=True` divides by the completion length, as TRL does
for `loss_type="ipo"`.

Only the logits of positions that predict a completion token are materialised, which skips
the vocabulary projection for prompt and padding tokens and is most of the memory of a
long-prompt batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from rewardplane.core.errors import ConfigError
from rewardplane.models.config import ModelConfig

if TYPE_CHECKING:
    from rewardplane.data.collate import Batch
    from rewardplane.data.records import TokenizedPair

POLICY_LOADER = "transformers.AutoModelForCausalLM"


def build_policy(model: ModelConfig, *, vocab_size: int | None = None):
    """An fp32 `AutoModelForCausalLM` from the `model:` section (the reward models' builder).

    `path` loads a local directory (or a GGUF file in it, dequantised) offline, without remote
    code unless `trust_remote_code` is set; `tiny` and `config` build a random-initialised model
    sized to the tokenizer. `init_from` (a reward-model checkpoint) has no policy meaning.
    """
    from transformers import AutoModelForCausalLM

    from rewardplane.models.reward_model import build_backbone, model_spec

    if model.init_from:
        raise ConfigError("model.init_from loads reward models; give a DPO policy with model.path")
    return build_backbone(model_spec(model), vocab_size=vocab_size, auto_class=AutoModelForCausalLM)


FUSED_HEAD_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
"""Architectures whose logits are exactly `lm_head(hidden)`: no scaling or soft-capping after
the head (tests compare each with the unfused path), so the head can be fused into the log-prob."""


def _output_head(model) -> tuple[torch.nn.Module | None, bool]:
    """The output projection, and whether completion log-probs may fuse it: a plain
    `nn.Linear` of a listed architecture in a model that FSDP does not manage (FSDP2 runs its
    reduce-scatter from hooks on module outputs, which a fused head's gradient bypasses).
    Anything else, e.g. a LoRA-wrapped head or a soft-capping model, takes the general path."""
    from torch.distributed.fsdp import FSDPModule

    inner = getattr(model, "module", model)  # DDP wraps the model; FSDP2 keeps its class
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    fusable = (
        type(head) is torch.nn.Linear
        and getattr(inner.config, "model_type", None) in FUSED_HEAD_MODEL_TYPES
        and not any(isinstance(module, FSDPModule) for module in inner.modules())
    )
    return head, fusable


def _completion_logps(model, kwargs: dict, rows: torch.Tensor, predictor: torch.Tensor, labels: torch.Tensor):
    """log p(label) [K] at the K positions that predict a completion token, in that order.

    A forward pre-hook on the output embedding takes only those hidden states, so the
    vocabulary projection never runs for prompt or padding positions, whatever the layout
    (transformers' `logits_to_keep` selects one set of columns for all rows, which in packed
    rows is nearly every column). Where the head is fusable, the hook hands it no rows at all
    and `linear_token_logps` projects the kept states chunk by chunk, so [K, vocab] logits are
    never stored; otherwise the head runs on the kept states, and anything the model does to
    logits after it (scaling, soft-capping) still applies.
    """
    head, fused = _output_head(model)
    if head is None:
        return token_logps(model(**kwargs, use_cache=False).logits[rows, predictor], labels)
    kept: list[torch.Tensor] = []

    def keep_predicting_positions(_module, args):
        hidden = args[0][rows, predictor]
        if not fused:
            return (hidden, *args[1:])
        kept.append(hidden)
        # detached: else autograd keeps the head's autocast copy of its weight for a 0-row output
        return (hidden[:0].detach(), *args[1:])

    handle = head.register_forward_pre_hook(keep_predicting_positions)
    try:
        logits = model(**kwargs, use_cache=False).logits
    finally:
        handle.remove()
    if not fused:
        return token_logps(logits, labels)
    return linear_token_logps(kept[0], head.weight, head.bias, labels)


LOGSUMEXP_CHUNK_ELEMENTS = 1 << 24
"""Logits processed per chunk by `token_logps` and `linear_token_logps`: 64 MB in fp32, about
0.2 GB of transients per chunk in all, and still 30 GFLOP per chunk projection at 0.5B shapes."""


def token_logps(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] per row, in fp32 at least, without an fp32 copy of the logits.

    The plain `logits.float()` → `logsumexp` keeps a [K, vocab] fp32 tensor for backward, and
    backward adds two more (fp32 and the logits' dtype). With a 152k vocabulary and 3k
    completion tokens that is about 5 GiB, the largest activation of a checkpointed DPO step.
    Here forward keeps only the logits as they are and one logsumexp per row, and backward
    recomputes the softmax in row chunks, writing the gradient straight in the logits' dtype.
    The arithmetic is fp32 (fp64 for fp64 logits) as before.
    """
    return _TokenLogps.apply(logits, labels)


def linear_token_logps(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor
) -> torch.Tensor:
    """`token_logps(F.linear(hidden, weight, bias), labels)` without ever holding the logits.

    `token_logps` still keeps the [K, vocab] logits for backward, and backward adds their
    gradient: about 1.9 GiB for 3k completion tokens of a 152k vocabulary in bf16. Here each
    chunk of rows is projected, reduced to its logsumexp and dropped; backward projects the
    chunk again and turns its softmax straight into the gradients of `hidden`, `weight` and
    `bias` (the technique of Liger's fused linear cross-entropy). Only [K, hidden] states are
    kept. The projection runs in autocast's dtype when autocast is on, as the head would;
    weight gradients are summed over chunks in fp32.
    """
    device = hidden.device.type
    compute = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
    return _LinearTokenLogps.apply(hidden, weight, bias, labels, compute)


def _chunks(rows: int, vocab: int):
    step = max(1, LOGSUMEXP_CHUNK_ELEMENTS // max(1, vocab))
    for start in range(0, rows, step):
        yield slice(start, start + step)


def _logits_grad(logits: torch.Tensor, lse: torch.Tensor, labels: torch.Tensor, grad_out: torch.Tensor):
    """d(grad_out · log softmax(logits)[label]) / d logits, in lse's dtype: g·(onehot − softmax).
    One buffer, updated in place (a copy even when the logits are already in lse's dtype)."""
    g = grad_out[:, None]
    grad = logits.to(lse.dtype, copy=True).sub_(lse[:, None]).exp_().mul_(-g)
    return grad.scatter_add_(-1, labels[:, None], g)


class _TokenLogps(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels):
        dtype = torch.promote_types(logits.dtype, torch.float32)
        lse = torch.empty(logits.shape[0], dtype=dtype, device=logits.device)
        for rows in _chunks(*logits.shape):
            lse[rows] = torch.logsumexp(logits[rows].to(dtype), dim=-1)
        ctx.save_for_backward(logits, labels, lse)
        return logits.gather(-1, labels[:, None]).squeeze(-1).to(dtype) - lse

    @staticmethod
    def backward(ctx, grad_out):
        logits, labels, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for rows in _chunks(*logits.shape):
            grad[rows] = _logits_grad(logits[rows], lse[rows], labels[rows], grad_out[rows])
        return grad, None


class _LinearTokenLogps(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, compute):
        dtype = torch.promote_types(compute, torch.float32)
        out = torch.empty(hidden.shape[0], dtype=dtype, device=hidden.device)
        lse = torch.empty_like(out)
        with torch.autocast(hidden.device.type, enabled=False):
            w, b = weight.to(compute), None if bias is None else bias.to(compute)
            for rows in _chunks(hidden.shape[0], weight.shape[0]):
                logits = torch.nn.functional.linear(hidden[rows].to(compute), w, b)
                lse[rows] = torch.logsumexp(logits.to(dtype), dim=-1)
                out[rows] = logits.gather(-1, labels[rows, None]).squeeze(-1).to(dtype)
        ctx.save_for_backward(hidden, weight, bias, labels, lse)
        ctx.compute = compute
        return out - lse

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, labels, lse = ctx.saved_tensors
        want_hidden, want_weight, want_bias = ctx.needs_input_grad[:3]
        compute = ctx.compute
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        accumulate = torch.promote_types(weight.dtype, torch.float32)
        grad_weight = (
            torch.zeros(weight.shape, dtype=accumulate, device=weight.device) if want_weight else None
        )
        grad_bias = (
            torch.zeros(weight.shape[0], dtype=accumulate, device=weight.device) if want_bias else None
        )
        with torch.autocast(hidden.device.type, enabled=False):
            w, b = weight.to(compute), None if bias is None else bias.to(compute)
            for rows in _chunks(hidden.shape[0], weight.shape[0]):
                h = hidden[rows].to(compute)
                logits = torch.nn.functional.linear(h, w, b)
                grad = _logits_grad(logits, lse[rows], labels[rows], grad_out[rows]).to(compute)
                if want_hidden:
                    grad_hidden[rows] = grad @ w
                if want_weight:
                    grad_weight += grad.T @ h
                if want_bias:
                    grad_bias += grad.sum(0)
        return (
            grad_hidden,
            None if grad_weight is None else grad_weight.to(weight.dtype),
            None if grad_bias is None else grad_bias.to(bias.dtype),
            None,
            None,
        )


def sequence_logps(
    model,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    segment_ids: torch.Tensor,
    num_segments: int,
    *,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    average: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence completion log-probs [num_segments] (fp32) and completion token counts.

    Pass `attention_mask` for padded batches, `position_ids` (restarting per sequence) and no
    mask for packed ones.
    """
    if attention_mask is not None and position_ids is None:
        # Left or right padding: positions count real tokens only.
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    same_sequence = segment_ids[:, 1:] == segment_ids[:, :-1]
    targets = (loss_mask[:, 1:] != 0) & same_sequence & (segment_ids[:, 1:] >= 0)
    rows, predictor = targets.nonzero(as_tuple=True)  # logits at `predictor` predict token predictor+1
    kwargs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
    boundaries = contextlib.nullcontext({})
    if attention_mask is None and position_ids is not None:
        from rewardplane.models.attention import packed_attention

        inner = getattr(model, "module", model)  # DDP wraps the model
        boundaries = packed_attention(inner.config, position_ids)
    with boundaries as extra:
        logps = _completion_logps(model, {**kwargs, **extra}, rows, predictor, input_ids[rows, predictor + 1])
    logps = logps.float()
    segments = segment_ids[rows, predictor + 1]
    totals = torch.zeros(num_segments, dtype=torch.float32, device=input_ids.device)
    totals = totals.index_add(0, segments, logps)
    counts = torch.zeros(num_segments, dtype=torch.long, device=input_ids.device)
    counts = counts.index_add(0, segments, torch.ones_like(segments))
    if average:
        totals = totals / counts.clamp(min=1)
    return totals, counts


def branch_targets(batch: Batch, pairs: Sequence[TokenizedPair]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-slot completion mask and sequence number (chosen_i = i, rejected_i = n + i, pad = −1).

    A branch occupies `len(branch)` slots of row `score_rows[k]` ending after its score token,
    so its first slot is `score_cols[k] − score_index`; this holds for every layout.
    """
    branches = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    rows = batch.score_rows.tolist()
    cols = batch.score_cols.tolist()
    loss_mask = torch.zeros(batch.input_ids.shape, dtype=torch.long)
    sequence = torch.full(batch.input_ids.shape, -1, dtype=torch.long)
    for k, branch in enumerate(branches):
        start = cols[k] - branch.score_index
        stop = start + len(branch)
        loss_mask[rows[k], start:stop] = torch.tensor(branch.loss_mask, dtype=torch.long)
        sequence[rows[k], start:stop] = k
    device = batch.input_ids.device
    return loss_mask.to(device), sequence.to(device)


def batch_logps(
    model, batch: Batch, pairs: Sequence[TokenizedPair], *, average: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) completion log-probs [n] of one collated batch of pairs, one forward pass."""
    loss_mask, sequence = branch_targets(batch, pairs)
    logps, _ = sequence_logps(
        model,
        batch.input_ids,
        loss_mask,
        sequence,
        2 * len(pairs),
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        average=average,
    )
    return logps[: len(pairs)], logps[len(pairs) :]


def dropout_settings(model) -> dict[str, float]:
    """Every dropout probability > 0 in the model: config fields and `nn.Dropout` modules."""
    found: dict[str, float] = {}
    config = getattr(model, "config", None)
    if config is not None:
        for key, value in config.to_dict().items():
            if ("dropout" in key or key.endswith("_pdrop")) and isinstance(value, int | float) and value > 0:
                found[f"config.{key}"] = float(value)
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Dropout) and module.p > 0:
            found[name] = float(module.p)
    return found


def check_policy_semantics(model, *, allow_dropout: bool) -> None:
    """Refuse dropout during DPO unless the config opts in.

    With dropout on, the policy's log-probs are a random variable while the reference's are
    not, so log π − log π_ref at step 0 is noise instead of 0 and the implicit reward is biased.
    """
    if allow_dropout:
        return
    active = dropout_settings(model)
    if active:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(active.items())[:4])
        raise ConfigError(
            f"policy has dropout > 0 ({shown}); DPO log-probs must be deterministic. "
            "Set the dropout fields to 0 or set policy.allow_dropout: true"
        )


def write_causal_lm(
    directory: Path, policy: nn.Module, state_dict: dict[str, torch.Tensor], tokenizer: Any
) -> str:
    """model.safetensors + config.json (+ generation config, tokenizer): a plain HF causal LM dir.

    Tied weights (embeddings = LM head) arrive as one storage under two names; safetensors
    refuses shared storage, so the second name gets its own copy.
    """
    from safetensors.torch import save_file

    from rewardplane.core.hashing import sha256_file
    from rewardplane.models.loading import WEIGHTS_FILE

    seen: set[int] = set()
    tensors = {}
    for name, value in state_dict.items():
        tensor = value.detach().to("cpu").contiguous()
        if tensor.data_ptr() in seen:
            tensor = tensor.clone()
        seen.add(tensor.data_ptr())
        tensors[name] = tensor
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    policy.config.save_pretrained(directory)
    if getattr(policy, "generation_config", None) is not None:
        policy.generation_config.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    return sha256_file(directory / WEIGHTS_FILE)
