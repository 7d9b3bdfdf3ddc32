"""The synth task: deterministic, valid, length-neutral, short; corrupt rows hit their reasons."""

from __future__ import annotations

import collections

import pytest

from rewardkit.data import reasons as R
from rewardkit.data.normalize import normalize_row
from rewardkit.data.reasons import Rejection
from rewardkit.data.synth import builtin_tokenizer, corrupt_rows, generate_rows
from rewardkit.data.tokenize import TokenizeSettings, tokenize_pair


def test_deterministic_and_seeded():
    assert generate_rows(50, seed=1) == generate_rows(50, seed=1)
    assert generate_rows(50, seed=1) != generate_rows(50, seed=2)
    assert generate_rows(10, seed=1) == generate_rows(50, seed=1)[:10]


def test_rows_are_valid_mixed_and_short():
    tok = builtin_tokenizer()
    rows = generate_rows(600, seed=0)
    pairs = [normalize_row(row) for row in rows]
    assert collections.Counter(p.subset for p in pairs).keys() == {"plain", "chat", "chat_implicit"}
    assert any(isinstance(row["chosen"], str) for row in rows) and any("prompt" not in row for row in rows)
    assert any(len(p.prompt) > 2 for p in pairs)  # multi-turn implicit prompts
    tokenized = [tokenize_pair(p, tok) for p in pairs]
    assert max(max(len(t.chosen), len(t.rejected)) for t in tokenized) <= 72


@pytest.mark.parametrize("measure", ["words", "chars", "tokens"])
def test_length_heuristic_is_near_chance(measure):
    tok = builtin_tokenizer()
    pairs = [normalize_row(row) for row in generate_rows(3000, seed=7)]

    def size(messages):
        text = messages[-1]["content"]
        return {"words": len(text.split()), "chars": len(text), "tokens": len(tok(text)["input_ids"])}[
            measure
        ]

    score = 0.0
    for p in pairs:
        c, r = size(p.chosen), size(p.rejected)
        score += 1.0 if c > r else 0.5 if c == r else 0.0
    assert 0.45 <= score / len(pairs) <= 0.55


def reason(row, settings):
    try:
        tokenize_pair(normalize_row(row), builtin_tokenizer(), settings)
    except Rejection as rejection:
        return rejection.reason
    return None


def test_corrupt_rows_hit_their_reason_codes():
    rows = corrupt_rows(2, seed=0)
    expected = collections.Counter(reason for reason, _ in rows)
    assert expected == {**{r: 2 for r in R.REASONS}, None: 2}
    truncate = TokenizeSettings(max_length=96, max_completion_length=96, truncation="truncate")
    seen_ids: set[str] = set()
    for want, row in rows:
        if want == R.DUPLICATE_ID:
            assert row["id"] in seen_ids
            continue
        if isinstance(row, dict) and "id" in row:
            seen_ids.add(row["id"])
        assert reason(row, truncate) == want
    # under the default drop policy the post-truncation rows are simply too long
    drop = TokenizeSettings()
    assert [reason(row, drop) for want, row in rows if want == R.POST_TRUNCATION] == [R.OVERSIZE] * 2
    assert [reason(row, drop) for want, row in rows if want == R.OVERSIZE] == [R.OVERSIZE] * 2
