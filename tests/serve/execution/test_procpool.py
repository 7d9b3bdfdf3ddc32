"""`DeadlinePool` on its own, with a target written by the test: results in order, a per-item
deadline enforced by killing the worker (its neighbours still get their own results), a worker
that dies fails only its running item, and a failing warm-up refuses to start."""

from __future__ import annotations

import os
import textwrap

import pytest

from rewardplane.serve.execution.procpool import DeadlinePool

TARGET = textwrap.dedent(
    """
    import os, time

    def run(x, options):
        if x == "sleep":
            time.sleep(60)
        if x == "die":
            os._exit(3)
        if x == "raise":
            raise ValueError("told to")
        return ("ok", x * options["k"])
    """
)


@pytest.fixture
def target(tmp_path, monkeypatch):
    (tmp_path / "pp_target.py").write_text(TARGET)
    # workers are fresh interpreters: they import the target from PYTHONPATH, as set at their start
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return "pp_target:run"


def pool(target: str, **kw) -> DeadlinePool:
    return DeadlinePool(
        target,
        {"k": 2},
        warmup=kw.pop("warmup", [(1,)]),
        label="test",
        workers=2,
        spares=1,
        timeout_s=kw.pop("timeout_s", 1.0),
        max_memory_mb=0,
        **kw,
    )


def test_results_in_order_and_errors_are_results(target):
    p = pool(target)
    p.start(timeout=60)
    try:
        got = p.map([(1,), (2,), ("raise",), (4,)])
        assert got[0] == ("ok", 2) and got[1] == ("ok", 4) and got[3] == ("ok", 8)
        assert got[2][:2] == ("error", "scorer_failed") and "ValueError" in got[2][2]
    finally:
        p.close()


def test_deadline_kills_the_worker_and_the_rest_still_score(target):
    p = pool(target, depth=2)
    p.start(timeout=60)
    try:
        got = p.map([("sleep",), (1,), ("die",), (3,), (5,)])
        assert got[0][:2] == ("error", "timeout")
        assert got[2][:2] == ("error", "scorer_failed")
        assert [got[i] for i in (1, 3, 4)] == [("ok", 2), ("ok", 6), ("ok", 10)]
        assert p.killed == 1 and p.replaced >= 2
        assert p.map([(7,)]) == [("ok", 14)]  # whole again
    finally:
        p.close()


def test_a_failing_warm_up_refuses_to_start(target):
    p = pool(target, warmup=[("raise",)])
    try:
        with pytest.raises(RuntimeError, match="warm-up failed"):
            p.start(timeout=60)
    finally:
        p.close()
