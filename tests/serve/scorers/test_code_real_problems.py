"""Real problems through the real service: a fixed sample of HumanEval (`check(candidate)` tests)
and MBPP (assert tests, some with `test_setup_code`: a tree built by `root.left = Node(2)`, a
`Pair` class, a builtin type as an argument) from ../shared/data. Every reference solution that
passes its tests under plain `python` scores 1.0, and the pass rate equals plain Python's; each
one-token mutant that plain Python rejects scores below 1.0 (or, when the mutant loops forever on
a case plain Python never reaches because it stops at the first failing assert, `timeout`: an
error, never a number). The full sets: benchmarks/verifier_integrity.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from rewardplane.serve.config import config_from_dict
from rewardplane.serve.execution import sandbox as sandbox_mod
from support.serve import LiveServer

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import verifier_integrity_tasks as tasks_mod

HUMANEVAL = ["0", "2", "10", "12", "32", "38", "53", "87", "100", "160"]
MBPP = ["2", "511", "533", "555", "601", "700", "776", "861", "927", "974"]
pytestmark = [
    pytest.mark.skipif(
        not (tasks_mod.DATA / "HumanEval.jsonl.gz").exists()
        or not (tasks_mod.DATA / "mbpp_prompt_validation_train.jsonl").exists(),
        reason=f"the public datasets are not in {tasks_mod.DATA} (see its README)",
    ),
    pytest.mark.skipif(not sandbox_mod.probe("namespaces")[0], reason="the kernel refuses namespaces here"),
]


def plain_python(program: str, tests: str) -> bool:
    try:
        run = subprocess.run([sys.executable, "-c", program + "\n" + tests], capture_output=True, timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return run.returncode == 0


@pytest.fixture(scope="module")
def sample() -> tuple[list[dict], list[dict]]:
    """(the reference solutions, one plain-Python-rejected mutant of each that has one)."""
    tasks = [t for t in tasks_mod.humaneval_tasks() if t["id"].split("/")[1] in HUMANEVAL]
    tasks += [t for t in tasks_mod.mbpp_tasks() if t["id"].split("/")[1] in MBPP]
    assert len(tasks) == len(HUMANEVAL) + len(MBPP)
    for t in tasks:
        t["plain"] = plain_python(t["program"], t["tests"])
    mutants = []
    for t in tasks:
        if t["plain"]:
            rejected = (
                m for m in tasks_mod.mutation_candidates(t) if not plain_python(m["program"], m["tests"])
            )
            mutants += [m for m in [next(rejected, None)] if m is not None]
    return tasks, mutants


def test_reference_solutions_score_as_plain_python_and_mutants_below_one(sample):
    tasks, mutants = sample
    cfg = config_from_dict(
        {"scorers": [{"name": "code", "kind": "code", "options": {"timeout_s": 5.0, "concurrency": 2}}]}
    )
    items = [
        {"id": t["id"], "response": t["program"], "reference": {"tests": t["tests"]}} for t in tasks + mutants
    ]
    with LiveServer(cfg) as live:
        r = httpx.post(live.url + "/v1/score", json={"scorers": ["code"], "items": items}, timeout=300)
    assert r.status_code == 200, r.text
    got = {
        x["id"]: x["scores"]["code"] if "code" in x["scores"] else x["errors"]["code"]["code"]
        for x in r.json()["results"]
    }
    honest = {t["id"]: got[t["id"]] for t in tasks}
    assert {k for k, v in honest.items() if v == 1.0} == {t["id"] for t in tasks if t["plain"]}, honest
    assert sum(t["plain"] for t in tasks) >= len(tasks) - 1  # the sample is mostly passing references
    assert len(mutants) >= len(tasks) // 2
    paid = {m["id"]: got[m["id"]] for m in mutants if not (got[m["id"]] == "timeout" or got[m["id"]] < 1.0)}
    assert not paid, paid
