"""benchmarks/verifier_integrity*.py's own logic, without running any program: the cases a peer
harness gets from assert tests, the one-token mutants, the counting and the page."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
tasks_mod = importlib.import_module("verifier_integrity_tasks")
report = importlib.import_module("verifier_integrity_report")


def test_calls_are_taken_only_from_literal_equality_asserts():
    mbpp = ast.parse("assert f(1, (2, 3)) == [4]\nassert f(0, ()) == []\n").body
    assert tasks_mod.calls_from_asserts(mbpp, None) == (
        "f",
        [[[1, {"tuple": [2, 3]}], [4]], [[0, {"tuple": []}], []]],
    )
    for other in (
        "assert f(1) == 2\nassert g(1) == 2\n",  # two functions
        "assert math.isclose(f(1), 2.0)\n",
        "assert set(f(1)) == {1}\n",  # a set cannot cross JSON
        "assert f(x) == 1\n",  # not a literal
        "assert f(1) < 2\n",
    ):
        assert tasks_mod.calls_from_asserts(ast.parse(other).body, None) is None, other
    check = ast.parse(
        'def check(candidate):\n    """doc"""\n    assert candidate(2) == 4\n    assert True, "x"\n'
    )
    assert tasks_mod.calls_from_asserts(check.body[0].body, "candidate") == ("candidate", [[[2], 4]])


def test_mutants_edit_one_token_of_the_solution_only():
    task = {
        "id": "t/1",
        "program": "def f(a):\r\n    '''1 < 2'''\r\n    return a + 1 < 3\r\n",
        "mutable_from": 0,
    }
    task["mutable_from"] = task["program"].index("return")
    found = tasks_mod.mutation_candidates(task, tries=10)
    assert {m["edit"] for m in found} == {"+->-", "1->2", "<->>=", "3->4"}
    for m in found:
        assert m["program"].startswith(task["program"][: task["mutable_from"]]) and m["kind"] == "mutant"
    assert tasks_mod.mutation_candidates(task, tries=10) == found  # the order is fixed by the id


def test_the_gsm8k_change_moves_only_the_final_number():
    assert tasks_mod.changed_final_number("3 + 4 = 7\n#### 1,007") == "3 + 4 = 7\n#### 1008"


def _task(tid: str, dataset: str, kind: str) -> dict:
    return {"id": tid, "set": dataset, "kind": kind, "family": "f"}


def test_summary_counts_paid_na_and_plain_python_beside():
    tasks = [
        _task("x1", "corpus", "exploit"),
        _task("x2", "corpus", "exploit"),
        _task("x3", "corpus", "exploit"),
    ]
    tasks += [_task("h1", "mbpp", "honest"), _task("h2", "mbpp", "honest"), _task("m1", "mbpp", "mutant")]
    scores = {
        "plain": {"x1": 1.0, "x2": 0.0, "x3": 1.0, "h1": 1.0, "h2": 0.0, "m1": 0.0},
        "peer": {"x1": 1.0, "x2": "harness died", "x3": "n/a", "h1": 0.5, "h2": 1.0, "m1": 1.0},
    }
    gsm = {"want": {"g": 1.0, "g~": 0.0}, "peer": {"g": 1.0, "g~": 1.0}}
    s = report.summarize(tasks, scores, gsm)
    assert s["peer"]["exploits_paid"] == ["x1"] and (s["peer"]["exploits_run"], s["peer"]["exploits_na"]) == (
        2,
        1,
    )
    assert s["peer"]["mbpp_honest"]["rejected_but_plain_python_passes"] == ["h1"]
    assert s["peer"]["mbpp_honest"]["accepted_but_plain_python_fails"] == ["h2"]
    assert s["peer"]["mbpp_mutants"]["paid"] == ["m1"] and s["peer"]["harness_errors"] == 1
    assert s["gsm8k"]["peer"] == {"own_answer_not_1": [], "changed_answer_not_0": ["g~"], "items": 2}
    page = report.render(
        {
            "summary": s,
            "machine": {
                "platform": "p",
                "cores": 2,
                "python": "3",
                "load_avg_at_start": [1, 1, 1],
                "load_avg_at_end": [2, 2, 2],
            },
            "command": "python benchmarks/verifier_integrity.py",
            "wall_s": 60,
            "seconds_per_verifier": {"peer": 1.0},
            "versions": {"evalplus": "0"},
            "corpus_exploits": 3,
            "mutants": {"problems_with_a_mutant": 1},
            "corpus": tasks[:3],
            "scores": scores,
        }
    )
    assert "| plain | 2 of 3 |" in page and "| peer | 1 of 2 (1 n/a) |" in page
    assert (
        "| `x1` | f | **PAID** | **PAID** |" in page and "| `x2` | f | 0.00 | error: harness died |" in page
    )


@pytest.mark.parametrize("score", [1.0, 1, 2.5])
def test_paid_is_a_number_at_least_one(score):
    assert report.paid(score) and not report.paid(True) and not report.paid("n/a") and not report.paid(0.99)


def _run(commit: str, scores: dict) -> dict:
    corpus = [{"id": "x1", "family": "f", "kind": "exploit"}, {"id": "ok", "family": "f", "kind": "honest"}]
    machine = {"load_avg_at_start": [1, 1, 1], "load_avg_at_end": [2, 2, 2]}
    return {
        "commit": commit,
        "command": f"python benchmarks/verifier_integrity.py  # {commit}",
        "wall_s": 60.0,
        "machine": machine,
        "seconds_per_verifier": dict.fromkeys(scores, 1.0),
        "corpus": corpus,
        "scores": scores,
        "summary": {"gsm8k": {"rewardplane": {"items": 0}}},
    }


def test_merge_takes_the_peers_not_run_now_and_names_each_columns_commit():
    ids = ("x1", "ok", "mbpp/1", "mbpp/1~m0")
    old = _run("old", {v: dict.fromkeys(ids, 1.0) for v in ("rewardplane", "plain", "peer")})
    new = _run("new", {"rewardplane": dict.fromkeys(ids, 0.0), "plain": dict.fromkeys(ids, 1.0)})
    merged = report.merge_peers(new, old, "old.json")
    assert merged["scores"]["peer"] == old["scores"]["peer"] and merged["scores"]["rewardplane"]["x1"] == 0.0
    assert merged["measured_at"] == {"rewardplane": "new", "plain": "new", "peer": "old"}
    s = merged["summary"]
    assert s["peer"]["exploits_paid"] == ["x1"] and s["rewardplane"]["exploits_paid"] == []
    assert (
        s["peer"]["mbpp_mutants"]["paid"] == ["mbpp/1~m0"]
        and s["rewardplane"]["mbpp_honest"]["rejected"] == 1
    )
    assert merged["merged_from"]["verifiers"] == ["peer"] and s["gsm8k"] == new["summary"]["gsm8k"]
    del old["scores"]["peer"]["mbpp/1"]
    with pytest.raises(SystemExit, match="peer has no score for mbpp/1"):
        report.merge_peers(new, old, "old.json")
