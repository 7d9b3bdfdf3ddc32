"""Text scorers: tokenised on admission, empty responses, padded buckets equal a plain forward."""

from __future__ import annotations

import pytest
import torch

from rewardkit.core.errors import ConfigError
from rewardkit.serve.scorers.base import ItemError, ScoreItem
from rewardkit.serve.scorers.text import SeqClsScorer


def scorer(**options) -> SeqClsScorer:
    s = SeqClsScorer("rm", shape="tiny-text-rm", options=options)
    s.load()
    return s


def items(*responses: str) -> list[ScoreItem]:
    return [ScoreItem(id=str(k), prompt="Say hello.", response=r) for k, r in enumerate(responses)]


def test_empty_or_blank_responses_are_bad_input_by_default_or_get_the_configured_reward():
    batch = items("Hello there!", "", "   \n")
    default = scorer().score_batch(batch)
    assert isinstance(default[0], float)
    assert [r.code for r in default[1:]] == ["bad_input", "bad_input"]
    fixed = scorer(empty_response=-1.5).score_batch(batch)
    assert fixed[1:] == [-1.5, -1.5] and fixed[0] == default[0]
    scored = scorer(empty_response="score").score_batch(batch)
    assert all(isinstance(r, float) for r in scored)
    with pytest.raises(ConfigError, match="empty_response"):
        SeqClsScorer("rm", shape="tiny-text-rm", options={"empty_response": "zero"})


def test_padded_buckets_score_like_one_plain_forward_per_item_and_report_padding():
    s = scorer(max_batch_tokens=64)
    batch = items("Hi.", "Hello! " * 12, "Good day to you, friend.", "Yes.")
    got = s.score_prepared([s.prepare(i) for i in batch])
    with torch.no_grad():
        plain = [float(s.model(input_ids=torch.tensor([s.prepare(i)])).logits[0, 0]) for i in batch]
    assert got == pytest.approx(plain, abs=1e-5)
    stats = s.take_batch_stats()
    assert stats["real"] == sum(len(s.prepare(i)) for i in batch)
    assert stats["computed"] == stats["real"] + stats["padding"] and stats["shared"] == 0
    assert s.info().extra["attention"] == "padded"  # no varlen kernel on CPU


def test_prepare_is_what_admission_runs_and_an_unencodable_item_fails_there():
    s = scorer()
    ids = s.prepare(items("Hello!")[0])
    assert isinstance(ids, list) and all(isinstance(t, int) for t in ids)
    bad = ScoreItem(id="x", prompt=[], response="Hello!")
    out = s.prepare(bad)
    assert isinstance(out, ItemError) and out.code == "bad_input"


def test_varlen_attention_is_refused_where_it_cannot_run():
    with pytest.raises(ConfigError, match="varlen needs CUDA"):
        scorer(attention="varlen")
