"""`answer_format: gsm8k` (issue 43 item 5): only the number on the last `#### N` line is read.
A fixed sample of GSM8K train solutions (../shared/data/gsm8k_train.jsonl) through a real server:
each scores 1.0 against its own answer and 0.0 with its final number changed. The whole train
split runs in benchmarks/verifier_integrity.py."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

pytest.importorskip("math_verify")

from rewardplane.core.errors import ConfigError
from rewardplane.serve.scorers.math import MathOptions, check_answer, final_marker_number
from support.serve import LiveServer, make_config

GSM8K = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "gsm8k_train.jsonl"
SAMPLE_EVERY = 150
"""Rows 0, 150, 300, ...: 50 of the 7,473, spread over the file."""

ISSUE_CASE = (
    "The discount is 3 / 30 = 10%.\nSo she pays 10% less.\n#### 11",
    "10",
)
"""Issue 43: worked text `= 10%`, a wrong final `#### 11`; `auto` extraction read the 10%."""


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("#### 72", Decimal(72)),
        ("so 5 + 7 = 12\n#### 12\n", Decimal(12)),
        ("#### 1,000", Decimal(1000)),
        ("#### $18.50.", Decimal("18.50")),
        ("#### -3", Decimal(-3)),
        ("#### 5\nlater text\n#### 6", Decimal(6)),  # the last marker only
        ("#### 11 or 10", None),  # a hedge is no answer
        ("#### \\frac{1}{2}", None),
        ("the answer is 72", None),  # no marker: no answer
        ("#### ", None),
        ("#### 1-2", None),
        ("#### nan", None),
    ],
)
def test_only_the_final_marker_is_read(text, want):
    assert final_marker_number(text) == want


def test_the_issues_case_scores_zero_in_gsm8k_format():
    response, reference = ISSUE_CASE
    assert check_answer(response, reference, {"answer_format": "gsm8k"}) == ("ok", 0.0)
    assert check_answer(response.replace("#### 11", "#### 10"), reference, {"answer_format": "gsm8k"}) == (
        "ok",
        1.0,
    )


def test_gsm8k_format_errors_and_options():
    assert check_answer("#### 4", "four", {"answer_format": "gsm8k"})[:2] == ("error", "bad_input")
    assert check_answer("#### 4", "x\n#### 4", {"answer_format": "gsm8k"}) == ("ok", 1.0)  # a whole solution
    assert check_answer("#### 5", "4", {"answer_format": "gsm8k", "format_bonus": 0.1}) == ("ok", 0.1)
    assert check_answer("5", "4", {"answer_format": "gsm8k", "format_bonus": 0.1}) == ("ok", 0.0)
    assert MathOptions().answer_format == "math"  # the default is unchanged
    with pytest.raises(ConfigError, match="extraction"):
        MathOptions(answer_format="gsm8k", extraction="boxed")


def _sample() -> list[dict]:
    if not GSM8K.exists():
        pytest.skip(f"{GSM8K} is not here (../shared/data/README.md)")
    rows = [json.loads(line) for line in GSM8K.read_text().splitlines()]
    return rows[::SAMPLE_EVERY]


def _changed(answer: str) -> str:
    head, _, last = answer.rpartition("#### ")
    return f"{head}#### {int(last.replace(',', '')) + 1}"


def test_gsm8k_train_sample_through_the_server():
    rows = _sample()
    items = []
    for k, row in enumerate(rows):
        gold = row["answer"].rpartition("#### ")[2]
        items.append({"id": f"own{k}", "response": row["answer"], "reference": gold})
        items.append({"id": f"changed{k}", "response": _changed(row["answer"]), "reference": gold})
    items.append({"id": "issue", "response": ISSUE_CASE[0], "reference": ISSUE_CASE[1]})
    options = {"answer_format": "gsm8k", "workers": 1, "spares": 0}
    config = make_config([{"name": "gsm8k", "kind": "math", "max_batch_size": 128, "options": options}])
    with LiveServer(config) as live:
        r = httpx.post(live.url + "/v1/score", json={"scorers": ["gsm8k"], "items": items}, timeout=120)
    assert r.status_code == 200, r.text
    got = {x["id"]: x["scores"].get("gsm8k", x["errors"].get("gsm8k")) for x in r.json()["results"]}
    assert len(rows) == 50
    assert {k: v for k, v in got.items() if k.startswith("own") and v != 1.0} == {}
    assert {k: v for k, v in got.items() if k.startswith("changed") and v != 0.0} == {}
    assert got["issue"] == 0.0
