"""Padding-free attention for packed rows: flash-attention varlen on CUDA, exact SDPA elsewhere.

Packed rows hold several sequences back to back with `position_ids` restarting at 0. With
plain SDPA, transformers turns the restarts into a dense block-causal mask of
[rows, 1, width, width], which rules out the flash kernel and spends attention FLOPs and
memory on blocks that are masked anyway. `rk_varlen` instead flattens the rows into one token
stream and hands the sequence boundaries (`cu_seq_lens`) to `torch.nn.attention.varlen`, the
flash-attention varlen kernel that ships with PyTorch, so each sequence attends only within
itself and no mask is built per layer.

It is a transformers attention implementation (`attn_implementation="rk_varlen"`, or `"auto"`,
which picks it when CUDA is present). Calls without `cu_seq_lens_q` — padded batches, serving,
encoders with an explicit mask — go to transformers' own SDPA path unchanged. Where the flash
kernel cannot run (CPU, fp32), the same boundaries are honoured by per-sequence SDPA, which is
what the CPU tests compare against the padded layouts.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import logging
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

VARLEN = "rk_varlen"
AUTO = "auto"
KV_INDEX = "rk_kv_index"
"""Forward kwarg: for each key slot of each sequence, the packed token it reads (prefix sharing)."""


def resolve_attn_implementation(name: str | None) -> str:
    """`auto` (or unset) → `rk_varlen` when CUDA is available, else `sdpa`; other names pass through."""
    if name in (None, "", AUTO):
        return VARLEN if torch.cuda.is_available() else "sdpa"
    return name


# Set while a forward carries explicit boundaries, so the mask hook below builds no mask.
_BOUNDARIES_GIVEN: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "rk_varlen_boundaries", default=False
)


def is_varlen(config: Any) -> bool:
    return getattr(config, "_attn_implementation", None) == VARLEN


def packed_row_length(config: Any, max_length: int | None) -> int | None:
    """Slots per packed row: unbounded (one row, no padding at all) for `rk_varlen`, whose cost
    does not grow with the row; `max_length` otherwise, which bounds SDPA's dense row mask."""
    return sys.maxsize if is_varlen(config) else max_length


@contextlib.contextmanager
def explicit_boundaries() -> Iterator[None]:
    """While active, `rk_varlen`'s mask hook builds no mask: the forward carries its boundaries."""
    token = _BOUNDARIES_GIVEN.set(True)
    try:
        yield
    finally:
        _BOUNDARIES_GIVEN.reset(token)


def boundaries_only_mask(device: torch.device | str) -> torch.Tensor:
    """An `attention_mask` for a forward that carries its boundaries (`cu_seq_lens_*`).

    Why: given no mask but `position_ids`, transformers looks for packed sequences in them
    (`find_packed_sequence_indices`), which reads a device value back to the host and so
    synchronises the stream: a batch queued behind a running forward would wait for it before
    launching a single kernel. A 4D mask is taken as already prepared and passed through
    untouched, and `rk_varlen` never reads it when boundaries are given."""
    return torch.ones((1, 1, 1, 1), dtype=torch.bool, device=device)


@contextlib.contextmanager
def packed_attention(config: Any, position_ids: torch.Tensor) -> Iterator[dict[str, Any]]:
    """Model-forward kwargs that tell `rk_varlen` where each packed sequence starts.

    Boundaries come from the restarting `position_ids` of the flattened rows, so trailing pad
    slots (which `collate` numbers as one more sequence) and row ends are boundaries too.
    Inside the block transformers builds no mask (the boundaries replace it); for any other
    attention implementation the kwargs are empty and transformers derives its own mask.
    """
    if not is_varlen(config):
        yield {}
        return
    flat = position_ids.reshape(-1)
    starts = (flat == 0).nonzero().flatten()
    end = torch.tensor([flat.numel()], device=flat.device, dtype=starts.dtype)
    cu = torch.cat([starts, end]).to(torch.int32)
    longest = int((cu[1:] - cu[:-1]).max())  # one host sync per forward, not per layer
    with explicit_boundaries():
        yield {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}


def _flash_varlen():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # torch < 2.10
        return None, frozenset()
    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


_VARLEN_ATTN, _VARLEN_PARAMS = _flash_varlen()


def _flash(q, k, v, cu_q, cu_k, max_q: int, max_k: int, scale: float | None, causal: bool) -> torch.Tensor:
    differentiable = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if not differentiable and not torch.compiler.is_compiling():
        return _flash_kernel(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal)
    kwargs: dict[str, Any] = {"scale": scale}
    if "window_size" in _VARLEN_PARAMS:  # torch >= 2.11
        kwargs["window_size"] = (-1, 0) if causal else (-1, -1)
    else:  # torch 2.10
        kwargs["is_causal"] = causal
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in _VARLEN_PARAMS:
            kwargs["enable_gqa"] = True
        else:
            k, v = _repeat_kv(k, v, q.shape[1])
    return _VARLEN_ATTN(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs)


def _flash_kernel(
    q, k, v, cu_q, cu_k, max_q: int, max_k: int, scale: float | None, causal: bool
) -> torch.Tensor:
    """Scoring (nothing to differentiate): the flash varlen kernel `varlen_attn` wraps, called
    directly. Grouped key heads go in as they are.

    Why: `varlen_attn` is a Python custom op, there for autograd, whose wrapper costs about
    150 µs of host time per call, once per layer. Before torch 2.13 it also refuses fewer key
    than query heads, so k and v had to be repeated, two more copies per layer. The kernel
    itself takes grouped heads; the H200 run in docs/benchmarks/serve_text.md (run 8) checked
    the output identical. A 0.5B forward is launched in about as long as the GPU takes to run
    it, so host time per layer is throughput there. Compiled graphs (training's `compile: true`)
    keep the custom op: it is what torch.compile knows how to trace, and a compiled graph pays
    no per-call host cost anyway.
    """
    window_right = 0 if causal else -1
    out = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False,
        scale=scale, window_size_left=-1, window_size_right=window_right,
    )  # fmt: skip
    return out[0]


def _repeat_kv(k: torch.Tensor, v: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    groups = heads // k.shape[1]
    return k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)


def _per_sequence(q, k, v, cu_q: torch.Tensor, cu_k: torch.Tensor, scale: float | None, causal: bool):
    """Reference semantics of the varlen kernel: SDPA on each sequence alone ([T, H, D] layout).

    A sequence may have more keys than queries (its queries are the last ones of the keys, as
    with a shared prompt prefix); causality is then aligned bottom-right, as flash-attention's.
    """
    if k.shape[1] != q.shape[1]:
        k, v = _repeat_kv(k, v, q.shape[1])
    outs = []
    for (q0, q1), (k0, k1) in zip(_spans(cu_q), _spans(cu_k), strict=True):
        qs, ks, vs = (x.transpose(0, 1) for x in (q[q0:q1], k[k0:k1], v[k0:k1]))
        if causal and q1 - q0 != k1 - k0:
            shift = (k1 - k0) - (q1 - q0)
            rows = torch.arange(q1 - q0, device=q.device)[:, None] + shift
            mask = torch.arange(k1 - k0, device=q.device)[None, :] <= rows
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale)
        else:
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=scale)
        outs.append(o.transpose(0, 1))
    return torch.cat(outs)


def _spans(cu: torch.Tensor) -> list[tuple[int, int]]:
    bounds = cu.tolist()
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention-interface entry: [B, H, S, D] in, [B, S, H, D] out."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if dropout:
        raise ValueError("rk_varlen does not implement attention dropout; set attention_dropout=0")
    window = kwargs.get("sliding_window")
    if window is not None and int(kwargs.get("max_length_k", kwargs["max_length_q"])) > window:
        # a window no sequence reaches (Mistral's 4096 on shorter inputs) changes nothing
        raise ValueError("rk_varlen does not implement sliding-window attention; use sdpa")
    rows, heads, width, dim = query.shape
    q = query.transpose(1, 2).reshape(rows * width, heads, dim)
    k = key.transpose(1, 2).reshape(rows * width, key.shape[1], dim)
    v = value.transpose(1, 2).reshape(rows * width, value.shape[1], dim)
    cu_k = kwargs.get("cu_seq_lens_k", cu)
    kv_index = kwargs.get(KV_INDEX)
    if kv_index is not None:
        # Shared prompt prefixes (models/packed_scoring.py): each sequence's keys are its
        # group's prefix tokens followed by its own, gathered from the packed stream.
        k, v = k.index_select(0, kv_index), v.index_select(0, kv_index)
    causal = bool(getattr(module, "is_causal", True))
    q, k, v = _autocast_inputs(q, k, v)
    if _VARLEN_ATTN is not None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        max_q = int(kwargs["max_length_q"])
        out = _flash(q, k, v, cu, cu_k, max_q, int(kwargs.get("max_length_k", max_q)), scaling, causal)
    else:
        if q.is_cuda:
            _warn_slow_path(q.dtype)
        out = _per_sequence(q, k, v, cu, cu_k, scaling, causal)
    return out.reshape(rows, width, heads, dim), None


def _autocast_inputs(q, k, v) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cast q, k, v to the autocast dtype, as autocast does for SDPA but not for a custom op.

    Under bf16 autocast the projections come out in bf16, but rotary embeddings multiply q and
    k by fp32 cos/sin (computed from the fp32 embedding output), which promotes them back to
    fp32. Without this cast every packed forward would miss the flash kernel.
    """
    device = q.device.type
    if not torch.is_autocast_enabled(device):
        return q, k, v
    dtype = torch.get_autocast_dtype(device)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@functools.cache
def _warn_slow_path(dtype: torch.dtype) -> None:
    logger.warning(
        "rk_varlen: %s inputs on CUDA have no flash varlen kernel; attending sequence by sequence "
        "(slow). Train in bf16/fp16 or use attn_implementation=sdpa",
        dtype,
    )


def register() -> None:
    """Make `rk_varlen` a valid `attn_implementation` (idempotent; runs on import)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    def mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
        # Calls without boundaries fall back to SDPA, so they need SDPA's masks; packed calls
        # with boundaries need none (a one-row micro-batch would otherwise get a T×T mask).
        return None if _BOUNDARIES_GIVEN.get() else sdpa_mask(*args, **kwargs)

    AttentionInterface.register(VARLEN, varlen_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(VARLEN, mask)


register()
