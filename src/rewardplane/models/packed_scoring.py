"""Score many token sequences with a last-token reward head: padding-free, prompts shared once.

A reward service receives sequences of very different lengths, and RL sends them in groups:
G responses to one prompt (GRPO). Padding every batch to its longest member wastes most of the
GPU on pad tokens, and scoring each response with its prompt recomputes that prompt G times.

`plan_packed` lays the sequences out as one packed token stream for `rk_varlen` attention
(models/attention.py):

- every sequence is its own attention span, positions restarting at 0, so no pad token is ever
  computed (the flash-attention varlen kernel takes the span boundaries);
- with `share_prefixes`, sequences that start with the same `min_prefix`+ tokens form a group:
  the common prefix is packed once, and each member contributes only its suffix, whose queries
  attend to the prefix's keys and then their own (positions continue after the prefix). Each
  sequence's keys are gathered from the stream by `rk_kv_index`; causality is aligned
  bottom-right, so a suffix token sees exactly what it would see in the unshared sequence.

The score is the head applied to the hidden state at each sequence's last token, as
`*ForSequenceClassification` and rewardplane's `RewardModel` read it. `padded_scores` is the
fallback where no varlen kernel runs (CPU, fp32): length-sorted buckets padded to a token
budget, so padding stays small without any special kernel.

`score_sequences` is the one entry both consumers call — the text scorers of `rewardplane serve`
and `rewardplane eval`'s reward-model scorer — so a checkpoint gets the same numbers from both:
packed forwards of at most `max_batch_tokens` tokens where `varlen_supported`, the padded
buckets otherwise.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
import torch

from rewardplane.models.attention import KV_INDEX, boundaries_only_mask, explicit_boundaries

VARLEN_FAMILIES = frozenset({"llama", "qwen2", "qwen3", "mistral", "gemma"})
"""Families whose attention rk_varlen serves and whose score is `head(last hidden state)`."""

MAX_SHARING_DEPTH = 32
"""Nesting levels of shared prefixes `prefix_groups` weighs (system prompt, prompt, ...) before
it takes the group as it is: bounds the work on adversarial inputs."""

ForwardPadded = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""forward(input_ids, attention_mask, lengths) → one score per right-padded row."""


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`t` on `device`. To CUDA through pinned memory: a copy from pageable memory synchronises
    the stream it is queued on, so the next batch's inputs would wait for the forward already
    running instead of queuing behind it (the text scorers keep two batches in flight)."""
    if str(device).startswith("cuda") and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device, non_blocking=True)


def to_host(t: torch.Tensor) -> torch.Tensor:
    """`t` on the host, waiting for the work queued before the copy and nothing after it: `.cpu()`
    synchronises the whole stream, so it would also wait for a batch another thread queued
    behind this one."""
    if t.device.type != "cuda":
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    done = torch.cuda.Event(blocking=True)  # the waiting thread sleeps: a spinning one costs a core
    done.record()
    done.synchronize()
    return host


@dataclass(frozen=True)
class PackedPlan:
    """One packed forward: the token stream, its attention spans and where each score is read."""

    input_ids: torch.Tensor  # [1, T] every computed token once
    position_ids: torch.Tensor  # [1, T]
    cu_q: torch.Tensor  # int32 [spans + 1] query span boundaries in the stream
    cu_k: torch.Tensor  # int32 [spans + 1] key span boundaries in the gathered keys
    kv_index: torch.Tensor | None  # [K] stream position of each gathered key (None: keys = queries)
    max_q: int
    max_k: int
    score_at: torch.Tensor  # [N] stream position of each input sequence's last token
    input_tokens: int  # tokens of the sequences as given
    shared_groups: int  # prefix groups formed

    @property
    def computed_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def saved_tokens(self) -> int:
        """Prompt tokens not recomputed thanks to prefix sharing."""
        return self.input_tokens - self.computed_tokens

    def forward_kwargs(self, device: torch.device | str) -> dict[str, object]:
        kwargs: dict[str, object] = {
            "input_ids": to_device(self.input_ids, device),
            "position_ids": to_device(self.position_ids, device),
            "cu_seq_lens_q": to_device(self.cu_q, device),
            "cu_seq_lens_k": to_device(self.cu_k, device),
            "max_length_q": self.max_q,
            "max_length_k": self.max_k,
            "attention_mask": boundaries_only_mask(device),
        }
        if self.kv_index is not None:
            kwargs[KV_INDEX] = to_device(self.kv_index, device)
        return kwargs


def _common_prefix(a: np.ndarray, b: np.ndarray, limit: int) -> int:
    """Length of the common prefix of a and b, at most `limit` (one vectorised comparison)."""
    limit = max(0, min(limit, len(a), len(b)))
    differs = np.flatnonzero(a[:limit] != b[:limit])
    return int(differs[0]) if differs.size else limit


def _arrays(seqs: Sequence[Sequence[int]]) -> list[np.ndarray]:
    return [np.asarray(s, dtype=np.int64) for s in seqs]


def prefix_groups(seqs: Sequence[Sequence[int]], min_prefix: int) -> list[tuple[int, list[int]]]:
    """(shared prefix length, member indices) for groups of ≥ 2 sequences sharing ≥ min_prefix
    leading tokens, chosen to save the most tokens. Each member keeps at least one token of its own
    (its score is read there).

    Sorted by their tokens, sequences sharing a prefix are adjacent and the prefix a run shares is
    the smallest adjacent common prefix. A run is split where that minimum occurs whenever its
    parts save more than the whole: with a system prompt common to everything, each prompt's
    responses share system prompt + prompt rather than all sequences sharing the system prompt.
    """
    seqs = _arrays(seqs)
    order = sorted((i for i, s in enumerate(seqs) if len(s) > min_prefix), key=lambda i: seqs[i].tolist())
    lcp = [_common_prefix(seqs[a], seqs[b], min(len(seqs[a]), len(seqs[b])) - 1) for a, b in pairwise(order)]
    groups: list[tuple[int, list[int]]] = []

    def runs(lo: int, hi: int, floor: int) -> list[tuple[int, int]]:
        """Maximal runs [a, b) of ≥ 2 sorted positions within [lo, hi) whose adjacent prefixes exceed `floor`."""
        out, start = [], lo
        for k in range(lo, hi):
            if k == hi - 1 or lcp[k] <= floor:
                if k + 1 - start >= 2:
                    out.append((start, k + 1))
                start = k + 1
        return out

    def best(lo: int, hi: int, depth: int) -> tuple[int, list[tuple[int, list[int]]]]:
        shared = min(lcp[lo : hi - 1])
        whole = (hi - lo - 1) * shared, [(shared, [order[j] for j in range(lo, hi)])]
        if depth >= MAX_SHARING_DEPTH:
            return whole
        saved, parts = 0, []
        for a, b in runs(lo, hi, shared):
            part_saved, part_groups = best(a, b, depth + 1)
            saved += part_saved
            parts += part_groups
        return (saved, parts) if saved > whole[0] else whole

    for a, b in runs(0, len(order), min_prefix - 1):
        groups += best(a, b, 0)[1]
    return groups


def plan_packed(
    seqs: Sequence[Sequence[int]], *, share_prefixes: bool = False, min_prefix: int = 16
) -> PackedPlan:
    """Lay `seqs` out as one packed stream (see the module docstring).

    The layout is decided per sequence and built per token with numpy (a batch is tens of
    thousands of tokens, planned on the scoring thread between two forwards)."""
    if not seqs or any(len(s) == 0 for s in seqs):
        raise ValueError("plan_packed needs non-empty sequences")
    arrays = _arrays(seqs)
    groups = prefix_groups(arrays, min_prefix) if share_prefixes else []
    grouped = {m: (g, shared) for g, (shared, members) in enumerate(groups) for m in members}
    # one span per row: (sequence, first token, tokens, first position, prefix span or -1)
    pieces: list[np.ndarray] = []
    q_lens: list[int] = []
    first_pos: list[int] = []
    prefix_of: list[int] = []  # the span index of the prefix the span attends to, or -1
    score_span = [0] * len(arrays)
    prefix_span: dict[int, int] = {}
    for i, seq in enumerate(arrays):
        if i not in grouped:
            pieces.append(seq)
            q_lens.append(len(seq))
            first_pos.append(0)
            prefix_of.append(-1)
        else:
            g, shared = grouped[i]
            if g not in prefix_span:
                prefix_span[g] = len(q_lens)
                pieces.append(seq[:shared])
                q_lens.append(shared)
                first_pos.append(0)
                prefix_of.append(-1)
            pieces.append(seq[shared:])
            q_lens.append(len(seq) - shared)
            first_pos.append(shared)
            prefix_of.append(prefix_span[g])
        score_span[i] = len(q_lens) - 1
    lens = np.asarray(q_lens, dtype=np.int64)
    ends = np.cumsum(lens)
    begins = ends - lens
    total = int(ends[-1])
    # a token's position: its offset in its span plus the span's first position
    positions = np.arange(total, dtype=np.int64) - np.repeat(begins - np.asarray(first_pos), lens)
    key_lens = lens.copy()
    kv_index = None
    if groups:
        prefixes = np.asarray(prefix_of)
        has = prefixes >= 0
        key_lens[has] += lens[prefixes[has]]
        own = [np.arange(begins[k], ends[k]) for k in range(len(q_lens))]
        # each span's keys: its prefix span's stream positions (if it has one), then its own
        keys = [(own[p], own[k]) if p >= 0 else (own[k],) for k, p in enumerate(prefix_of)]
        kv_index = np.concatenate([part for parts in keys for part in parts])
    zero = np.zeros(1, dtype=np.int64)
    return PackedPlan(
        input_ids=torch.from_numpy(np.concatenate(pieces))[None],
        position_ids=torch.from_numpy(positions)[None],
        cu_q=torch.from_numpy(np.concatenate([zero, ends]).astype(np.int32)),
        cu_k=torch.from_numpy(np.concatenate([zero, np.cumsum(key_lens)]).astype(np.int32)),
        kv_index=None if kv_index is None else torch.from_numpy(kv_index),
        max_q=int(lens.max()),
        max_k=int(key_lens.max()),
        score_at=torch.from_numpy(ends[score_span] - 1),
        input_tokens=sum(len(s) for s in arrays),
        shared_groups=len(groups),
    )


def packed_scores(
    backbone: torch.nn.Module, head: Callable[[torch.Tensor], torch.Tensor], plan: PackedPlan
) -> torch.Tensor:
    """One forward of the packed stream through `backbone` (attn_implementation `rk_varlen`), the
    head at each sequence's last token: [N] scores in the head's dtype."""
    device = next(backbone.parameters()).device
    kwargs = plan.forward_kwargs(device)
    with explicit_boundaries():
        hidden = backbone(**kwargs, use_cache=False).last_hidden_state
    last = hidden[0].index_select(0, to_device(plan.score_at, device))
    weight = getattr(head, "weight", None)
    if weight is not None:
        last = last.to(weight.dtype)
    return head(last).reshape(-1)


BUCKET_SPREAD = 1.25
"""A padded bucket holding `max_batch_tokens / 16` tokens is cut before a sequence longer than this
times its shortest: every row then pads at most 20% of its slots."""


def length_buckets(lengths: Sequence[int], max_batch_tokens: int) -> list[list[int]]:
    """Indices sorted by length and cut so that rows × longest row ≤ max_batch_tokens (a sequence
    longer than the budget gets a bucket of its own), and so that a bucket past a sixteenth of the
    budget spans at most `BUCKET_SPREAD` in length: a wide bucket would pad its short rows to its
    longest (37% of the slots for the demo's probe with the budget alone)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    buckets: list[list[int]] = []
    current: list[int] = []
    real = 0
    for i in order:
        n = lengths[i]
        full = (len(current) + 1) * n > max_batch_tokens
        wide = (
            real >= max_batch_tokens // 16 and n > BUCKET_SPREAD * lengths[current[0]] if current else False
        )
        if current and (full or wide):
            buckets.append(current)
            current, real = [], 0
        current.append(i)
        real += n
    if current:
        buckets.append(current)
    return buckets


def padded_scores(
    forward: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    seqs: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    max_batch_tokens: int,
    device: torch.device | str,
    on_scored: Callable[[int], None] | None = None,
) -> tuple[torch.Tensor, int]:
    """(scores, token slots computed) through `forward(input_ids, attention_mask, lengths)` on
    right-padded length buckets; the slots minus the real tokens are the padding. `on_scored(n)`
    is called after each bucket with its number of sequences (a progress bar's hook)."""
    out = torch.empty(len(seqs), dtype=torch.float32)
    slots = 0
    for bucket in length_buckets([len(s) for s in seqs], max_batch_tokens):
        width = max(len(seqs[i]) for i in bucket)
        slots += width * len(bucket)
        input_ids = torch.full((len(bucket), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(bucket), width), dtype=torch.long)
        for row, i in enumerate(bucket):
            input_ids[row, : len(seqs[i])] = torch.as_tensor(seqs[i])
            mask[row, : len(seqs[i])] = 1
        lengths = mask.sum(1)
        scores = forward(input_ids.to(device), mask.to(device), lengths.to(device))
        out[torch.tensor(bucket)] = scores.float().cpu()
        if on_scored is not None:
            on_scored(len(bucket))
    return out, slots


def varlen_supported(config: Any, device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether a packed `rk_varlen` forward serves this backbone: a family in `VARLEN_FAMILIES`,
    the flash varlen kernel present, CUDA, bf16/fp16 (elsewhere rk_varlen attends sequence by
    sequence, slower than padded buckets)."""
    from rewardplane.models.attention import _VARLEN_ATTN

    return (
        config is not None
        and getattr(config, "model_type", None) in VARLEN_FAMILIES
        and _VARLEN_ATTN is not None
        and str(device).startswith("cuda")
        and dtype in (torch.bfloat16, torch.float16)
    )


def budget_chunks(lengths: Sequence[int], max_batch_tokens: int) -> list[list[int]]:
    """Indices in the given order, cut into runs of at most `max_batch_tokens` tokens (a longer
    sequence gets a run of its own): one packed forward each."""
    chunks: list[list[int]] = [[]]
    used = 0
    for i, n in enumerate(lengths):
        if chunks[-1] and used + n > max_batch_tokens:
            chunks.append([])
            used = 0
        chunks[-1].append(i)
        used += n
    return chunks if chunks[0] else []


def last_token_forward(
    backbone: torch.nn.Module, head: Callable[[torch.Tensor], torch.Tensor]
) -> ForwardPadded:
    """The padded counterpart of `packed_scores`: the head at each right-padded row's last real token."""

    def forward(input_ids: torch.Tensor, attention_mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        hidden = backbone(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state
        last = hidden[torch.arange(hidden.shape[0], device=hidden.device), lengths - 1]
        weight = getattr(head, "weight", None)
        if weight is not None:
            last = last.to(weight.dtype)
        return head(last).reshape(-1)

    return forward


_STREAM_LOCKS: dict[tuple[int, int], threading.Lock] = {}
_STREAM_LOCKS_GUARD = threading.Lock()


def stream_launch_lock(device: torch.device | str) -> AbstractContextManager:
    """The lock held while a packed forward's kernels are queued on `device`'s current stream
    (one per stream, shared by every thread and scorer of the process); none off CUDA.

    Why: two threads keep batches in flight on one stream (serve/scorers/text.py). Queuing at
    the same time, their kernels interleave on the stream, the two forwards run as one and end
    together, and the GPU waits while both threads take their next batches. Queued whole, the
    first forward ends a forward earlier and its thread's next batch is queued while the second
    runs (H200 runs 8-9, docs/benchmarks/serve_text.md). Streams of their own (consolidated
    workers, deploy/streams.py) keep locks of their own and do not wait for each other.
    """
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return contextlib.nullcontext()
    stream = torch.cuda.current_stream(device)
    key = (stream.device.index, stream.cuda_stream)
    with _STREAM_LOCKS_GUARD:
        return _STREAM_LOCKS.setdefault(key, threading.Lock())


def score_sequences(seqs: Sequence[Sequence[int]], **options: Any) -> tuple[torch.Tensor, dict[str, int]]:
    """fp32 scores (host, input order) read at each sequence's last token, and the token accounting
    `{real, computed, padding, shared}`: `score_sequence_chunks` of one chunk, with its options.

    `varlen`: packed forwards of `backbone` (attn_implementation `rk_varlen`) + `head`, at most
    `max_batch_tokens` tokens each; with `share_prefixes` the sequences are packed in token order,
    so those sharing a prompt sit in one forward and the prompt is computed once. The scores stay
    on the device until the last forward is queued, so the host plans the next forward while the
    GPU runs this one. Otherwise: `padded_scores` through `forward` (default `last_token_forward`).
    `on_scored(n)` is called as each forward's n sequences are queued (a progress bar's hook).
    """
    return score_sequence_chunks([seqs], **options)


def _padded_sequence_scores(
    forward: ForwardPadded | None,
    seqs: list[Sequence[int]],
    pad_token_id: int,
    max_batch_tokens: int,
    device: torch.device | str,
    on_scored: Callable[[int], None] | None,
) -> tuple[torch.Tensor, dict[str, int]]:
    """The padded path of `score_sequence_chunks`: every sequence at once, length-sorted buckets."""
    real = sum(map(len, seqs))
    if not seqs:
        return torch.empty(0), {"real": 0, "computed": 0, "padding": 0, "shared": 0}
    scores, slots = padded_scores(
        forward, seqs, pad_token_id=pad_token_id, max_batch_tokens=max_batch_tokens, device=device,
        on_scored=on_scored,
    )  # fmt: skip
    return scores, {"real": real, "computed": slots, "padding": slots - real, "shared": 0}


def score_sequence_chunks(
    chunks: Iterable[Sequence[Sequence[int]]],
    *,
    varlen: bool,
    max_batch_tokens: int,
    backbone: torch.nn.Module | None = None,
    head: Callable[[torch.Tensor], torch.Tensor] | None = None,
    forward: ForwardPadded | None = None,
    pad_token_id: int = 0,
    device: torch.device | str = "cpu",
    share_prefixes: bool = False,
    min_prefix: int = 16,
    on_scored: Callable[[int], None] | None = None,
    launch_lock: AbstractContextManager | None = None,
) -> tuple[torch.Tensor, dict[str, int]]:
    """`score_sequences` of the chunks' sequences in the order they come (scores in that order),
    packing each chunk as it arrives.

    `launch_lock` is held while a packed forward's kernels are queued; by default the lock of the
    stream they go on (`stream_launch_lock`), so threads keeping batches in flight on one stream
    queue each forward whole, one after another.

    Why: an evaluation tokenises thousands of texts. Fed from a tokenising thread chunk by chunk,
    the packed path queues a chunk's forwards while the next chunk is tokenised, so the GPU is not
    idle for the whole tokenisation first. Forwards are cut as in `score_sequences`: whole budgets
    of the sequences seen so far (sorted by tokens within each chunk with `share_prefixes`), the
    last, partly filled one held back for the next chunk. One chunk packs exactly as
    `score_sequences`. The padded path has nothing to overlap (it runs on the host's own time):
    it takes all chunks, then scores.
    """
    if not varlen:
        seqs = [s for chunk in chunks for s in chunk]
        if forward is None and seqs:
            if backbone is None or head is None:
                raise ValueError("score_sequences needs a forward, or a backbone and a head")
            forward = last_token_forward(backbone, head)
        return _padded_sequence_scores(forward, seqs, pad_token_id, max_batch_tokens, device, on_scored)
    parts: list[torch.Tensor] = []
    order: list[int] = []  # stream position of each score in `parts`
    pending: list[tuple[int, Sequence[int]]] = []
    real = computed = total = 0
    lock = launch_lock or stream_launch_lock(device)  # the stream is the caller's for the whole call

    def pack(final: bool) -> None:
        nonlocal pending, computed
        runs = budget_chunks([len(s) for _, s in pending], max_batch_tokens)
        keep = [] if final or not runs else runs.pop()  # a partial budget waits for the next chunk
        if runs and (backbone is None or head is None):
            raise ValueError("the varlen path needs the backbone and the head")
        for run in runs:
            plan = plan_packed(
                [pending[i][1] for i in run], share_prefixes=share_prefixes, min_prefix=min_prefix
            )
            with lock:
                parts.append(packed_scores(backbone, head, plan).float())
            order.extend(pending[i][0] for i in run)
            computed += plan.computed_tokens
            if on_scored is not None:
                on_scored(len(run))
        pending = [pending[i] for i in keep]

    for chunk in chunks:
        arrived = [(total + i, s) for i, s in enumerate(chunk)]
        total += len(arrived)
        real += sum(len(s) for _, s in arrived)
        if share_prefixes:
            arrived.sort(key=lambda entry: list(entry[1]))
        pending += arrived
        pack(final=False)
    pack(final=True)
    if not total:
        return torch.empty(0), {"real": 0, "computed": 0, "padding": 0, "shared": 0}
    scores = torch.empty(total, dtype=torch.float32)
    scores[torch.as_tensor(order, dtype=torch.long)] = to_host(torch.cat(parts))
    return scores, {"real": real, "computed": computed, "padding": 0, "shared": real - computed}
