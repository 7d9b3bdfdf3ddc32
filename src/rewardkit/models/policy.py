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
from typing import Any

import torch

from rewardkit.errors import ConfigError

POLICY_LOADER = "transformers.AutoModelForCausalLM"


def build_policy(cfg: Any, *, vocab_size: int | None = None):
    """An fp32 `AutoModelForCausalLM` from the `model:` section (the reward models' builder).

    `path` loads a local directory (or a GGUF file in it, dequantised) offline, without remote
    code unless `trust_remote_code` is set; `tiny` and `config` build a random-initialised model
    sized to the tokenizer. `init_from` (a reward-model checkpoint) has no policy meaning.
    """
    from transformers import AutoModelForCausalLM

    from rewardkit.models.reward_model import build_backbone
    from rewardkit.train.recipes.reward_model import _model_spec

    if cfg.model.init_from:
        raise ConfigError("model.init_from loads reward models; give a DPO policy with model.path")
    return build_backbone(_model_spec(cfg), vocab_size=vocab_size, auto_class=AutoModelForCausalLM)


def _completion_logits(model, kwargs: dict, rows: torch.Tensor, predictor: torch.Tensor) -> torch.Tensor:
    """Logits [K, vocab] at the K positions that predict a completion token, in that order.

    A forward pre-hook on the output embedding hands the LM head only those hidden states, so
    the vocabulary projection never runs for prompt or padding positions, whatever the layout
    (transformers' `logits_to_keep` selects one set of columns for all rows, which in packed
    rows is nearly every column). Anything the model does to logits after its head (scaling,
    soft-capping) still applies.
    """
    inner = getattr(model, "module", model)  # DDP wraps the model; FSDP2 keeps its class
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if head is None:
        return model(**kwargs, use_cache=False).logits[rows, predictor]

    def keep_predicting_positions(_module, args):
        return (args[0][rows, predictor], *args[1:])

    handle = head.register_forward_pre_hook(keep_predicting_positions)
    try:
        return model(**kwargs, use_cache=False).logits
    finally:
        handle.remove()


LOGSUMEXP_CHUNK_ELEMENTS = 1 << 26
"""Logits processed per chunk by `token_logps` (256 MB in fp32)."""


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


def _chunks(logits: torch.Tensor):
    rows = max(1, LOGSUMEXP_CHUNK_ELEMENTS // max(1, logits.shape[-1]))
    for start in range(0, logits.shape[0], rows):
        yield slice(start, start + rows)


class _TokenLogps(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels):
        dtype = torch.promote_types(logits.dtype, torch.float32)
        lse = torch.empty(logits.shape[0], dtype=dtype, device=logits.device)
        for rows in _chunks(logits):
            lse[rows] = torch.logsumexp(logits[rows].to(dtype), dim=-1)
        ctx.save_for_backward(logits, labels, lse)
        return logits.gather(-1, labels[:, None]).squeeze(-1).to(dtype) - lse

    @staticmethod
    def backward(ctx, grad_out):
        logits, labels, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for rows in _chunks(logits):
            g = grad_out[rows, None]  # forward's output dtype, lse's
            part = torch.exp(logits[rows].to(lse.dtype) - lse[rows, None]).mul_(-g)
            part.scatter_add_(-1, labels[rows, None], g)
            grad[rows] = part
        return grad, None


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
        from rewardkit.models.attention import packed_attention

        inner = getattr(model, "module", model)  # DDP wraps the model
        boundaries = packed_attention(inner.config, position_ids)
    with boundaries as extra:
        selected = _completion_logits(model, {**kwargs, **extra}, rows, predictor)
    logps = token_logps(selected, input_ids[rows, predictor + 1]).float()
    segments = segment_ids[rows, predictor + 1]
    totals = torch.zeros(num_segments, dtype=torch.float32, device=input_ids.device)
    totals = totals.index_add(0, segments, logps)
    counts = torch.zeros(num_segments, dtype=torch.long, device=input_ids.device)
    counts = counts.index_add(0, segments, torch.ones_like(segments))
    if average:
        totals = totals / counts.clamp(min=1)
    return totals, counts


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
