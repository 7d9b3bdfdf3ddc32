"""Failures the policy chooses never pay (issue 44), through a real server: a composite with
`on_failure: renormalize` over `code` and a format regex gave a program that loops until the
timeout 1.25 against 0.25 for an honestly wrong one, because it renormalised over the timeout.
Now the timeout is the item's own failure: it counts as the code component's lowest score, and
the error the trainer sees says which kind it is."""

from __future__ import annotations

import httpx
import pytest

from rewardplane.serve.execution import sandbox as sandbox_mod
from support.serve import LiveServer, make_config

NAMESPACES_OK = sandbox_mod.probe("namespaces")[0]
CODE = {"timeout_s": 1.0, "concurrency": 2}
if not NAMESPACES_OK:
    CODE["isolation"] = "rlimits"
REFERENCE = {"tests": "assert f(1) == 2\nassert f(5) == 6"}
PROGRAMS = {
    "right": "```python\ndef f(x):\n    return x + 1\n```",
    "wrong": "```python\ndef f(x):\n    return x\n```",
    "loops": "```python\ndef f(x):\n    while True:\n        pass\n```",
    "crashes": "```python\nimport sys\nsys.setrecursionlimit(10**6)\ndef f(x):\n    return f(x)\n```",
}


@pytest.fixture(scope="module")
def results():
    composite = {
        "name": "reward",
        "kind": "composite",
        "options": {
            "on_failure": "renormalize",
            "components": [
                {"name": "correct", "kind": "code", "weight": 1.0, "options": CODE},
                {"name": "format", "kind": "regex", "weight": 0.25, "options": {"pattern": "```python"}},
            ],
        },
    }
    with LiveServer(make_config([composite, {"name": "code", "kind": "code", "options": CODE}])) as live:
        items = [
            {"id": k, "prompt": "f(x) = x + 1", "response": v, "reference": REFERENCE}
            for k, v in PROGRAMS.items()
        ]
        r = httpx.post(
            f"{live.url}/v1/score", json={"scorers": ["reward", "code"], "items": items}, timeout=120
        )
        assert r.status_code == 200, r.text
        return {res["id"]: res for res in r.json()["results"]}


def test_a_program_that_loops_until_the_timeout_scores_no_more_than_an_honest_wrong_one(results):
    assert results["right"]["scores"]["reward"] == pytest.approx(1.25)
    assert results["wrong"]["scores"]["reward"] == pytest.approx(0.25)
    loops = results["loops"]
    assert results["loops"]["errors"]["code"]["code"] == "timeout"  # the plain code scorer says why
    assert loops["scores"]["reward"] <= results["wrong"]["scores"]["reward"]
    detail = loops["details"]["reward"]
    assert detail["components"] == {"correct": 0.0, "format": 1.0} and detail["floored"] == ["correct"]
    assert detail["component_errors"]["correct"]["kind"] == "item" and "left_out" not in detail


def test_every_failure_of_the_programs_own_doing_is_marked_as_the_items(results):
    for name in ("loops", "crashes"):
        got = results[name]
        assert got["scores"]["reward"] <= results["wrong"]["scores"]["reward"], got
        if "code" in got["errors"]:  # a crash may also be a plain failed test (0.0)
            assert got["errors"]["code"]["kind"] == "item", got["errors"]
