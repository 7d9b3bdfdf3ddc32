"""Request text is read in linear time (issue 44): `regex` patterns run by RE2 and refused at
config time where RE2 cannot run them, the start-up warning for a mis-pasted pattern (issue 47),
the code scorer's fence scan, and the per-item deadline that gives a slow item `timeout`
without holding its batch-mates."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardplane.core.errors import ConfigError
from rewardplane.serve.batcher import DynamicBatcher
from rewardplane.serve.config import config_from_dict
from rewardplane.serve.protocol import ItemError, ScoreItem
from rewardplane.serve.scorers.code import extract_code, fenced_blocks
from rewardplane.serve.scorers.rules import RegexScorer

DOCS = Path(__file__).resolve().parents[3] / "docs"


def _config_error(pattern: str) -> str:
    raw = {"scorers": [{"name": "fmt", "kind": "regex", "options": {"pattern": pattern}}]}
    with pytest.raises(ConfigError) as caught:
        config_from_dict(raw)
    return str(caught.value)


@pytest.mark.parametrize(
    ("pattern", "construct"),
    [
        (r"(a)\1", "backreference"),
        (r"(?P<x>a)(?P=x)", "backreference"),
        (r"x(?=y)", "lookahead"),
        (r"(?<!a)b", "negative lookahead or lookbehind"),
        (r"(?>ab)", "atomic group"),
        (r"a++", "possessive quantifier"),
        (r"a\Z", "\\z"),
    ],
)
def test_a_pattern_re2_cannot_run_refuses_the_config_in_one_line(pattern, construct):
    message = _config_error(pattern)
    assert "\n" not in message and "'fmt'" in message and construct in message
    assert message.startswith("scorers[0].options.pattern:")


def test_a_pattern_that_is_not_a_regex_is_still_a_compile_error():
    assert "does not compile" in _config_error("(a")


@pytest.mark.parametrize(
    ("options", "text", "hit"),
    [
        ({"pattern": "ANSWER", "flags": ["IGNORECASE"]}, "the answer", True),
        ({"pattern": "^b$", "flags": ["MULTILINE"]}, "a\nb\nc", True),
        ({"pattern": "^b$"}, "a\nb\nc", False),
        ({"pattern": "a.b", "flags": ["DOTALL"]}, "a\nb", True),
        ({"pattern": "a.b"}, "a\nb", False),
        ({"pattern": r"\d+", "mode": "fullmatch"}, "123", True),
        ({"pattern": r"\d+", "mode": "fullmatch"}, "123x", False),
        ({"pattern": r"\\boxed\{"}, r"so \boxed{4}", True),
    ],
)
def test_regex_scorer_matches_through_re2(options, text, hit):
    scorer = RegexScorer("r", options)
    assert scorer.score_batch([ScoreItem(id="1", prompt="", response=text)]) == [float(hit)]


def _docs_format_component() -> dict[str, Any]:
    block = (
        (DOCS / "verifiers.md")
        .read_text()
        .split("```yaml\nscorers:\n  - name: reward\n    kind: composite")[1]
    )
    config = yaml.safe_load("scorers:\n  - name: reward\n    kind: composite" + block.split("```")[0])
    components = config["scorers"][0]["options"]["components"]
    return next(c for c in components if c["name"] == "format")


def test_the_docs_format_pattern_matches_a_box_and_warns_of_nothing():
    spec = _docs_format_component()
    scorer = RegexScorer("format", spec["options"])
    assert scorer.pattern_warning() is None
    hit = ScoreItem(id="1", prompt="", response=r"The answer is \boxed{42}.")
    assert scorer.score_batch([hit]) == [1.0]


def test_a_yaml_pasted_pattern_warns_once_at_start_up_naming_scorer_and_pattern(caplog):
    pasted = yaml.safe_load(r'p: "\\\\boxed\\\\{"')["p"]  # the issue-47 paste: one level too many
    assert pasted == r"\\boxed\\{"
    scorer = RegexScorer("format", {"pattern": pasted})
    with caplog.at_level(logging.WARNING):
        scorer.load()
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1 and "'format'" in lines[0] and repr(pasted) in lines[0] and "\n" not in lines[0]


def test_a_pattern_matching_none_of_its_examples_warns():
    scorer = RegexScorer("format", {"pattern": r"\[\[A\]\]", "examples": ["[[B]]", "[A]"]})
    assert "matches none of its 2 examples" in scorer.pattern_warning()
    assert RegexScorer("ok", {"pattern": "B", "examples": ["[[B]]"]}).pattern_warning() is None


_OLD_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)```", re.DOTALL)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(["```", "``", "`", "\n", "python", " ", "\t", "x", "py3 y", "é"]), max_size=24)
)
def test_the_fence_scan_finds_what_the_old_regex_found(parts):
    text = "".join(parts)
    assert fenced_blocks(text) == _OLD_FENCE.findall(text)


def test_an_unclosed_fence_with_a_long_tail_is_the_whole_response():
    text = "```\n" + "a" * 100_000
    assert extract_code(text) == text
    assert extract_code("```python\nprint(1)\n```\n```\n" + "b" * 1000) == "print(1)\n"


class _Slow(RegexScorer):
    """A rule whose item 'slow' runs until released: the per-item deadline must not wait for it."""

    kind: ClassVar[str] = "test_slow_rule"

    def __init__(self) -> None:
        super().__init__("slow", {"pattern": "x", "deadline_s": 0.2}, max_batch_size=8, max_wait_ms=20)
        self.release = threading.Event()
        self.finished: list[str] = []

    def score_batch(self, items: list[ScoreItem]) -> list[float | ItemError]:
        if items[0].response == "slow":
            self.release.wait(30)
        self.finished.append(str(items[0].response))
        return super().score_batch(items)


def test_an_item_past_its_deadline_is_timeout_and_its_batch_mates_do_not_wait():
    scorer = _Slow()

    async def run() -> list[Any]:
        batcher = DynamicBatcher(scorer, max_batch_size=8, max_wait_ms=20, max_queue=64)
        batcher.start()
        try:
            items = [
                ScoreItem(id=str(i), prompt="", response=r) for i, r in enumerate(["x", "slow", "y", "xx"])
            ]
            return await batcher.submit(items)
        finally:
            scorer.release.set()
            await batcher.stop()

    results = asyncio.run(run())
    assert results[0] == 1.0 and results[2] == 0.0 and results[3] == 1.0
    assert isinstance(results[1], ItemError) and results[1].code == "timeout"
    assert "slow" not in scorer.finished[:3]  # answered before the slow item was let go
