"""Collate `TokenizedPair`s into model inputs: right-padded, left-padded or packed rows.

Every layout yields the same per-sequence scores (tested to 1e-5 in fp32); they differ only in
how much compute is spent on padding. Sequences are ordered chosen_0..chosen_{n-1},
rejected_0..rejected_{n-1}, so `scores[:n]` are the chosen scores and `scores[n:]` the
rejected ones. Attention masks and score positions come from sequence lengths, never from
token values, so a tokenizer whose pad token equals its EOS token is handled correctly.

Packed rows hold several sequences back to back with `position_ids` restarting at 0 for each
one. Decoders get no attention mask: transformers then derives a block-causal mask from the
restarting positions (flash-attention varlen when that kernel is active, a block mask for
SDPA/eager). Encoders get an explicit block-diagonal 4-D mask built from `segment_ids`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from rewardplane.data.records import TokenizedPair

Layout = Literal["right", "left", "packed"]
LAYOUTS: tuple[str, ...] = ("right", "left", "packed")


@dataclass
class Batch:
    """Model inputs for 2·num_pairs sequences plus where to read each sequence's score."""

    layout: str
    input_ids: torch.Tensor  # [rows, width]
    position_ids: torch.Tensor  # [rows, width]
    attention_mask: torch.Tensor | None  # [rows, width] for padded layouts, None when packed
    segment_ids: torch.Tensor | None  # [rows, width] packed only: sequence number per slot, -1 = pad
    score_rows: torch.Tensor  # [2·num_pairs]
    score_cols: torch.Tensor  # [2·num_pairs]
    num_pairs: int
    num_tokens: int  # real (non-pad) tokens

    @classmethod
    def scored_at_last_token(
        cls, input_ids: torch.Tensor, attention_mask: torch.Tensor, lengths: torch.Tensor
    ) -> Batch:
        """Right-padded rows already on their device (a scorer's bucket), each read at its last
        token (`lengths - 1`); no pairs."""
        rows = input_ids.shape[0]
        columns = torch.arange(input_ids.shape[1], device=input_ids.device).expand(rows, -1)
        return cls(layout="right", input_ids=input_ids, position_ids=columns * attention_mask,
                   attention_mask=attention_mask, segment_ids=None,
                   score_rows=torch.arange(rows, device=input_ids.device), score_cols=lengths - 1,
                   num_pairs=0, num_tokens=int(lengths.sum()))  # fmt: skip

    @property
    def num_slots(self) -> int:
        return self.input_ids.numel()

    @property
    def padding_efficiency(self) -> float:
        return self.num_tokens / max(1, self.num_slots)

    def to(self, device: torch.device | str) -> Batch:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=True)

        return Batch(
            layout=self.layout,
            input_ids=move(self.input_ids),
            position_ids=move(self.position_ids),
            attention_mask=move(self.attention_mask),
            segment_ids=move(self.segment_ids),
            score_rows=move(self.score_rows),
            score_cols=move(self.score_cols),
            num_pairs=self.num_pairs,
            num_tokens=self.num_tokens,
        )


def _sequences(pairs: Sequence[TokenizedPair], max_length: int | None) -> tuple[list[list[int]], list[int]]:
    branches = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    seqs, score_idx = [], []
    for pair_no, branch in enumerate(branches):
        n = len(branch.input_ids)
        if n == 0:
            raise ValueError(f"pair {pairs[pair_no % len(pairs)].pair_id!r} has an empty branch")
        if max_length is not None and n > max_length:
            raise ValueError(
                f"pair {pairs[pair_no % len(pairs)].pair_id!r}: branch of {n} tokens exceeds max_length={max_length}"
            )
        if not 0 <= branch.score_index < n:
            raise ValueError(
                f"pair {pairs[pair_no % len(pairs)].pair_id!r}: score_index {branch.score_index} outside 0..{n - 1}"
            )
        seqs.append(list(branch.input_ids))
        score_idx.append(branch.score_index)
    return seqs, score_idx


def collate(
    pairs: Sequence[TokenizedPair],
    *,
    layout: Layout = "right",
    pad_token_id: int = 0,
    max_length: int | None = None,
    row_length: int | None = None,
) -> Batch:
    """Build one `Batch`. `max_length` bounds each sequence and, when packed, each row unless
    `row_length` sets the packed row capacity (see `attention.packed_row_length`)."""
    if not pairs:
        raise ValueError("cannot collate an empty list of pairs")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    seqs, score_idx = _sequences(pairs, max_length)
    if layout == "packed":
        capacity = row_length or max_length or max(map(len, seqs))
        return _packed(seqs, score_idx, len(pairs), pad_token_id, capacity)
    width = max(map(len, seqs))
    rows = len(seqs)
    input_ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((rows, width), dtype=torch.long)
    attention_mask = torch.zeros((rows, width), dtype=torch.long)
    score_cols = []
    for row, (seq, idx) in enumerate(zip(seqs, score_idx, strict=True)):
        n = len(seq)
        start = 0 if layout == "right" else width - n
        input_ids[row, start : start + n] = torch.tensor(seq, dtype=torch.long)
        position_ids[row, start : start + n] = torch.arange(n)
        attention_mask[row, start : start + n] = 1
        score_cols.append(start + idx)
    return Batch(
        layout=layout,
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=attention_mask,
        segment_ids=None,
        score_rows=torch.arange(rows),
        score_cols=torch.tensor(score_cols, dtype=torch.long),
        num_pairs=len(pairs),
        num_tokens=sum(map(len, seqs)),
    )


def _packed(
    seqs: list[list[int]], score_idx: list[int], num_pairs: int, pad_token_id: int, capacity: int
) -> Batch:
    """First-fit-decreasing bin packing into rows of `capacity` slots."""
    order = sorted(range(len(seqs)), key=lambda i: (-len(seqs[i]), i))
    rows: list[list[int]] = []  # sequence numbers per row
    fill: list[int] = []
    for i in order:
        n = len(seqs[i])
        for r, used in enumerate(fill):
            if used + n <= capacity:
                rows[r].append(i)
                fill[r] += n
                break
        else:
            rows.append([i])
            fill.append(n)
    width = max(fill)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((len(rows), width), dtype=torch.long)
    segment_ids = torch.full((len(rows), width), -1, dtype=torch.long)
    score_rows = [0] * len(seqs)
    score_cols = [0] * len(seqs)
    for r, members in enumerate(rows):
        offset = 0
        for seg, i in enumerate(members):
            n = len(seqs[i])
            input_ids[r, offset : offset + n] = torch.tensor(seqs[i], dtype=torch.long)
            position_ids[r, offset : offset + n] = torch.arange(n)
            segment_ids[r, offset : offset + n] = seg
            score_rows[i], score_cols[i] = r, offset + score_idx[i]
            offset += n
        # Trailing pad slots count upwards from 0 as one more "sequence", so the restart-based
        # packed-sequence detection in transformers keeps them apart from real tokens.
        position_ids[r, offset:] = torch.arange(width - offset)
    return Batch(
        layout="packed",
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=None,
        segment_ids=segment_ids,
        score_rows=torch.tensor(score_rows, dtype=torch.long),
        score_cols=torch.tensor(score_cols, dtype=torch.long),
        num_pairs=num_pairs,
        num_tokens=sum(map(len, seqs)),
    )


def block_attention_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """Bidirectional block-diagonal [rows, 1, width, width] bool mask (True = attend) for encoders.

    Pad slots attend to themselves only, so no softmax row is empty (which would give NaN).
    """
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    real = (segment_ids[:, :, None] >= 0) & (segment_ids[:, None, :] >= 0)
    eye = torch.eye(segment_ids.shape[1], dtype=torch.bool, device=segment_ids.device)[None]
    return ((same & real) | eye)[:, None]
