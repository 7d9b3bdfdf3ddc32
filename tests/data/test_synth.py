"""The synth task: deterministic, valid, short; the rule is length-neutral, the annotator's labels are
length-biased by the documented flip rule; corrupt rows hit their reasons."""

from __future__ import annotations

import collections

import pytest

from rewardplane.data import reasons as R
from rewardplane.data.normalize import normalize_row
from rewardplane.data.reasons import Rejection
from rewardplane.data.synth import builtin_tokenizer, corrupt_rows, flip_probability, generate_rows
from rewardplane.data.tokenize import TokenizeSettings, tokenize_pair


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


def _length_heuristic(pairs, size):
    score = 0.0
    for p in pairs:
        c, r = size(p.chosen), size(p.rejected)
        score += 1.0 if c > r else 0.5 if c == r else 0.0
    return score / len(pairs)


@pytest.mark.parametrize("measure", ["words", "chars", "tokens"])
def test_length_heuristic_is_near_chance_for_the_rule(measure):
    tok = builtin_tokenizer()
    pairs = [normalize_row(row) for row in generate_rows(3000, seed=7, annotator_noise=False)]

    def size(messages):
        text = messages[-1]["content"]
        return {"words": len(text.split()), "chars": len(text), "tokens": len(tok(text)["input_ids"])}[
            measure
        ]

    assert 0.45 <= _length_heuristic(pairs, size) <= 0.55


def _words(messages):
    return len(messages[-1]["content"].replace(" and ", ", ").split(", "))


def test_annotator_flips_by_the_documented_rule():
    noisy = generate_rows(20000, seed=11)
    clean = generate_rows(20000, seed=11, annotator_noise=False)
    flipped = {d: [0, 0] for d in range(-3, 4)}
    for row, rule in zip(noisy, clean, strict=True):
        was_flipped = row["metadata"]["flipped"]
        assert (row["chosen"], row["rejected"]) == (
            (rule["rejected"], rule["chosen"]) if was_flipped else (rule["chosen"], rule["rejected"])
        )
        rule_pair = normalize_row(rule)
        d = _words(rule_pair.rejected) - _words(rule_pair.chosen)
        flipped[d][0] += 1
        flipped[d][1] += was_flipped
    for d, (n, k) in flipped.items():
        assert k / n == pytest.approx(flip_probability(d), abs=0.03), d
    assert flip_probability(-2) == 0.08 and flip_probability(1) == 0.2 and flip_probability(3) == 0.6
    rate = sum(k for _, k in flipped.values()) / len(noisy)
    assert 0.15 <= rate <= 0.2  # so a model that learns the rule lands near 0.83, not 1.0
    # the labels now carry a length bias: "pick the longer answer" beats chance
    assert 0.56 <= _length_heuristic([normalize_row(r) for r in noisy], _words) <= 0.62


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
