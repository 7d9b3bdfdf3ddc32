"""A fake benchmark scorer: each text's score is the number after its last `score=` (the
convention of the fixtures in tests/eval/fixtures), read back from the tokens it is given."""

from __future__ import annotations

import re

import numpy as np

from rewardplane.data.synth import builtin_tokenizer
from rewardplane.objectives.base import PairScorer

_SCORE = re.compile(r"score=(-?[0-9.]+)")


def read_score(tokenizer, branch) -> float:
    ids = [t for t, m in zip(branch.input_ids, branch.loss_mask, strict=True) if m]
    return float(_SCORE.findall(tokenizer.decode(ids))[-1].rstrip("."))


def fake_scorer(offset: dict[str, float] | None = None) -> PairScorer:
    """Scores each branch with the last `score=X` in its completion (+ an optional per-text offset)."""
    tok = builtin_tokenizer()
    offset = offset or {}
    calls = []

    def read(branch) -> float:
        text = tok.decode([t for t, m in zip(branch.input_ids, branch.loss_mask, strict=True) if m])
        return read_score(tok, branch) + sum(v for k, v in offset.items() if k in text)

    def score(pairs, batch_size, progress=None):
        calls.append(len(pairs))
        return (
            np.array([read(p.chosen) for p in pairs]),
            np.array([read(p.rejected) for p in pairs]),
            None,
        )

    scorer = PairScorer("reward_model", tok, {"fake": True}, score)
    scorer.calls = calls  # type: ignore[attr-defined]
    return scorer
