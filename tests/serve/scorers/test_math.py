"""The `math` scorer: right/wrong/equivalent answers, errors for missing references and for
pathological inputs (killed from outside within the limit), a pool that stays healthy, HTTP."""

from __future__ import annotations

import time

import httpx
import pytest

pytest.importorskip("math_verify")

from rewardplane.core.errors import ConfigError
from rewardplane.serve.protocol import ItemError, ScoreItem
from rewardplane.serve.scorers.math import MathScorer
from support.serve import LiveServer, make_config

TIMEOUT_S = 1.5


@pytest.fixture(scope="module")
def scorer():
    s = MathScorer("math", options={"workers": 2, "spares": 1, "timeout_s": TIMEOUT_S})
    s.load()
    yield s
    s.close()


def item(response: str, reference, i: str = "x") -> ScoreItem:
    return ScoreItem(id=i, prompt="", response=response, reference=reference)


TABLE = [
    # (response, reference, expected score)
    ("The answer is \\boxed{\\frac{1}{2}}.", "0.5", 1.0),  # fraction vs decimal
    ("The answer is \\boxed{\\frac{2}{4}}.", "\\frac{1}{2}", 1.0),  # unreduced fraction
    ("Thus $x = \\frac{3}{4}$", "3/4", 1.0),  # inline LaTeX, no box
    ("After simplifying we get 42.", "42", 1.0),  # last number
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),  # symbolic equivalence
    ("\\boxed{[1, 2)}", "[1,2)", 1.0),  # interval
    ("\\boxed{(1, 2)}", "[1,2)", 0.0),  # interval with the wrong bracket
    ("\\boxed{x^2 + 2x + 1}", "(x+1)^2", 1.0),  # polynomial identity
    ("\\boxed{5\\text{ cm}}", "5", 1.0),  # units are dropped
    ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),  # wrong
    ("I do not know.", "7", 0.0),  # no answer at all is wrong, not an error
    ("\\boxed{\\{1, 2, 3\\}}", "\\{3, 2, 1\\}", 1.0),  # sets are unordered
]


def test_answer_table(scorer):
    got = scorer.score_batch([item(r, ref, str(i)) for i, (r, ref, _) in enumerate(TABLE)])
    assert got == [want for _, _, want in TABLE], list(zip(TABLE, got, strict=True))


@pytest.mark.parametrize("reference", [None, "", {"not": "a string"}])
def test_missing_reference_is_bad_input_not_zero(scorer, reference):
    (got,) = scorer.score_batch([item("\\boxed{1}", reference)])
    assert isinstance(got, ItemError) and got.code == "bad_input"


def test_unparseable_reference_is_bad_input(scorer):
    (got,) = scorer.score_batch([item("\\boxed{1}", "\\\\\\")])
    assert isinstance(got, ItemError) and got.code == "bad_input"


def wait_whole(pool, workers: int, within_s: float = 60.0) -> None:
    """Wait until `workers` live workers are active again (a killed one is replaced in the
    background: a warm spare at once, a fresh process within its start-up time)."""
    deadline = time.monotonic() + within_s
    while pool.alive() != workers:
        assert time.monotonic() < deadline, f"{pool.alive()} of {workers} workers after {within_s} s"
        time.sleep(0.05)


PATHOLOGICAL = [
    "\\boxed{10^{10^{10^{10^{10}}}}}",  # sympy tries to evaluate the tower
    "$" + "\\frac{" * 400 + "1" + "}{2}" * 400 + "$",  # deeply nested LaTeX
    "\\boxed{" + "(" * 2000 + "1" + ")" * 2000 + "}",
]


def test_pathological_inputs_are_errors_within_the_limit_and_the_pool_recovers(scorer):
    ok = [item("\\boxed{3}", "3", "ok1"), item("\\boxed{4}", "3", "ok2")]
    bad = [item(text, "5", f"bad{i}") for i, text in enumerate(PATHOLOGICAL)]
    t0 = time.monotonic()
    got = scorer.score_batch([ok[0], *bad, ok[1]])
    elapsed = time.monotonic() - t0
    assert got[0] == 1.0 and got[-1] == 0.0  # the neighbours are unaffected
    for err in got[1:-1]:
        assert isinstance(err, ItemError) and err.code in ("timeout", "scorer_failed"), err
    # each bad item ends within its limit (+ a spare's start when several die back to back)
    assert elapsed < len(bad) * TIMEOUT_S + 20
    # the pool is whole again (replacements start in the background, a warm spare first) ...
    wait_whole(scorer.pool, 2)
    # ... and every worker answers an ordinary batch without needing a deadline (no worker is
    # killed for it: a count, not a time, so a loaded machine cannot fail it)
    killed = scorer.info().extra["workers_killed"]
    assert killed >= 1
    again = scorer.score_batch([item("\\boxed{\\frac{1}{2}}", "0.5", str(i)) for i in range(20)])
    assert again == [1.0] * 20
    assert scorer.info().extra["workers_killed"] == killed


def test_timeout_is_enforced_from_outside(scorer):
    t0 = time.monotonic()
    (got,) = scorer.score_batch([item(PATHOLOGICAL[0], "5")])
    assert isinstance(got, ItemError) and got.code == "timeout"
    # ended by the deadline: the tower never finishes (the ceiling is slack for a loaded machine)
    assert TIMEOUT_S <= time.monotonic() - t0 < TIMEOUT_S + 10


@pytest.fixture(scope="module")
def one_deep():
    """One worker holding four items at a time: a batch goes to it in chunks."""
    s = MathScorer("math", options={"workers": 1, "spares": 1, "timeout_s": TIMEOUT_S, "depth": 4})
    s.load()
    yield s
    s.close()


def test_a_timeout_in_the_middle_of_a_chunk_fails_only_that_item(one_deep):
    pool = one_deep.pool
    killed, requeued = pool.killed, pool.requeued
    batch = [
        item("\\boxed{3}", "3", "a"),
        item(PATHOLOGICAL[0], "5", "hang"),  # sent with a, c and d in one message
        item("\\boxed{\\frac{2}{4}}", "0.5", "c"),
        item("\\boxed{4}", "3", "d"),
        item("\\boxed{x^2+2x+1}", "(x+1)^2", "e"),
    ]
    t0 = time.monotonic()
    got = one_deep.score_batch(batch)
    assert TIMEOUT_S <= time.monotonic() - t0 < TIMEOUT_S + 10
    assert got[0] == 1.0 and got[2:] == [1.0, 0.0, 1.0]  # the items behind it got their real scores
    assert isinstance(got[1], ItemError) and got[1].code == "timeout", got[1]
    assert pool.killed == killed + 1
    assert pool.requeued >= requeued + 2  # c and d waited in the killed worker and were re-sent
    wait_whole(pool, 1)


def test_a_worker_that_dies_mid_chunk_fails_only_its_running_item(one_deep):
    import os
    import signal
    import threading

    pool = one_deep.pool
    wait_whole(pool, 1)
    worker = pool._active[0]
    batch = [
        item("\\boxed{3}", "3", "a"),
        item(PATHOLOGICAL[0], "5", "victim"),
        item("\\boxed{7}", "7", "c"),
        item("\\boxed{1}", "7", "d"),
    ]

    def kill_when_the_victim_runs():
        deadline = time.monotonic() + 60
        while len(worker.outstanding) != 3:  # a's result is in
            assert time.monotonic() < deadline, worker.outstanding
            time.sleep(0.005)
        time.sleep(0.1)
        os.kill(worker.proc.pid, signal.SIGKILL)  # as the OOM killer or a segfault would

    killer = threading.Thread(target=kill_when_the_victim_runs)
    killer.start()
    got = one_deep.score_batch(batch)
    killer.join()
    assert got[0] == 1.0 and got[2:] == [1.0, 0.0]  # c and d were re-sent to the spare
    # ended by the death (a deadline would have said `timeout`)
    assert isinstance(got[1], ItemError) and got[1].code == "scorer_failed" and "died" in got[1].message
    wait_whole(pool, 1)


def test_concurrent_batches_share_the_pool(scorer):
    from concurrent.futures import ThreadPoolExecutor

    batches = [[item(r, ref, f"{b}-{i}") for i, (r, ref, _) in enumerate(TABLE)] for b in range(6)]
    with ThreadPoolExecutor(6) as threads:
        results = list(threads.map(scorer.score_batch, batches))
    assert results == [[want for _, _, want in TABLE]] * 6


def test_options_are_checked():
    with pytest.raises(ConfigError, match="extraction"):
        MathScorer("m", options={"extraction": "guess"})
    with pytest.raises(
        ConfigError, match=r"unknown config key options.timeout \(did you mean options.timeout_s\?\)"
    ):
        MathScorer("m", options={"timeout": 3})
    with pytest.raises(ConfigError, match="format_bonus"):
        MathScorer("m", options={"format_bonus": 1.5})


def test_format_bonus_tolerance_and_boxed_mode():
    from rewardplane.serve.scorers.math import check_answer

    opts = {"format_bonus": 0.1}
    assert check_answer("\\boxed{4}", "3", opts) == ("ok", 0.1)  # wrong but boxed
    assert check_answer("it is 4", "3", opts) == ("ok", 0.0)  # wrong, not boxed
    assert check_answer("\\boxed{3}", "3", opts) == ("ok", 1.0)
    assert check_answer("\\boxed{3.14159}", "\\pi", {})[1] == 0.0
    assert check_answer("\\boxed{3.14159}", "\\pi", {"rel_tol": 1e-5}) == ("ok", 1.0)
    assert check_answer("the answer is 3", "3", {"extraction": "boxed"}) == ("ok", 0.0)
    assert check_answer("so \\boxed{3}", "3", {"extraction": "boxed"}) == ("ok", 1.0)
    assert check_answer("12 apples, then 1,250 pears", "1250", {"extraction": "last_number"}) == ("ok", 1.0)


def test_through_http_with_info():
    cfg = make_config(
        [{"name": "math", "kind": "math", "options": {"workers": 1, "spares": 0, "timeout_s": 1.0}}]
    )
    with LiveServer(cfg) as server:
        items = [
            {"id": "right", "response": "\\boxed{\\frac{1}{2}}", "reference": "0.5"},
            {"id": "wrong", "response": "\\boxed{2}", "reference": "0.5"},
            {"id": "noref", "response": "\\boxed{2}"},
            {"id": "slow", "response": PATHOLOGICAL[0], "reference": "5"},
            {"id": "after", "response": "\\boxed{7}", "reference": "7"},
        ]
        r = httpx.post(server.url + "/v1/score", json={"scorers": ["math"], "items": items}, timeout=60)
        assert r.status_code == 200, r.text
        res = {x["id"]: x for x in r.json()["results"]}
        assert res["right"]["scores"] == {"math": 1.0}
        assert res["wrong"]["scores"] == {"math": 0.0}
        assert res["noref"]["errors"]["math"]["code"] == "bad_input" and res["noref"]["scores"] == {}
        assert res["slow"]["errors"]["math"]["code"] == "timeout" and res["slow"]["scores"] == {}
        assert res["after"]["scores"] == {"math": 1.0}
        info = next(s for s in httpx.get(server.url + "/v1/scorers").json()["scorers"] if s["name"] == "math")
        assert info["kind"] == "math"
        assert "math-verify" in info["extra"]["backend"] and info["extra"]["limits"]["timeout_s"] == 1.0


def test_a_composites_inline_math_component_shares_the_hosted_scorers_pool(scorer):
    """Issue 47 item 8: one math pool a configuration, not one a scorer; another configuration
    (here another timeout) gets its own, and the pool outlives its first user's close."""
    from rewardplane.serve.execution import shared
    from rewardplane.serve.scorers.composite import CompositeScorer

    options = {"workers": 2, "spares": 1, "timeout_s": TIMEOUT_S}
    composite = CompositeScorer(
        "comp", options={"components": [{"name": "m", "kind": "math", "options": options}]}
    )
    other = MathScorer("slow", options={**options, "timeout_s": TIMEOUT_S * 2})
    composite.load()
    other.load()
    try:
        (inline,) = composite.scorers
        assert inline.pool is scorer.pool and shared.users(scorer.pool) == 2
        assert other.pool is not scorer.pool and shared.users(other.pool) == 1
    finally:
        composite.close()
        other.close()
    assert shared.users(scorer.pool) == 1
    assert scorer.score_batch([item("\\boxed{4}", "4")]) == [1.0]
