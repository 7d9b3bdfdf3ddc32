"""Scoring apart (`serve/apart.py`): each item under its own deadline, a failure its own, and
the loop woken per thread, not per item."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

from rewardplane.serve import apart
from rewardplane.serve.batcher import check_value
from rewardplane.serve.protocol import ItemError


def _run(score_one, payloads, *, workers=4, deadline_s=5.0, wait=False):
    """`wait`: let the threads that started finish before returning (a thread not yet started
    when the last item is scored is cancelled, as the batcher's own pool would never run it)."""
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        return asyncio.run(
            apart.score_apart(pool, workers, score_one, payloads, deadline_s, check_value, "t")
        )
    finally:
        pool.shutdown(wait=wait, cancel_futures=True)


def test_every_item_is_scored_once_in_order():
    seen: list[int] = []
    lock = threading.Lock()

    def one(p):
        with lock:
            seen.append(p)
        return [float(p) * 2]

    assert _run(one, list(range(200))) == [2.0 * i for i in range(200)]
    assert sorted(seen) == list(range(200))


def test_an_item_that_raises_or_answers_wrongly_fails_alone():
    def one(p):
        if p == "boom":
            raise ValueError("no")
        if p == "two":
            return [1.0, 2.0]
        if p == "nan":
            return [float("nan")]
        return [1.0]

    out = _run(one, ["a", "boom", "two", "nan", "b"])
    assert out[0] == 1.0 and out[4] == 1.0
    assert [r.code for r in out[1:4]] == ["scorer_failed", "scorer_failed", "non_finite"]
    assert "ValueError" in out[1].message


def test_slow_items_time_out_and_the_rest_are_scored_by_the_free_threads():
    release = threading.Event()

    def one(p):
        if p == "slow":
            release.wait(30)
        return [1.0]

    try:
        out = _run(one, ["slow", "slow", *"abcdefgh"], workers=3, deadline_s=0.2)
    finally:
        release.set()
    assert [r.code for r in out[:2]] == ["timeout", "timeout"]
    assert out[2:] == [1.0] * 8  # one thread left did them all, none waited for a slow one


def test_the_loop_is_woken_once_per_thread_not_once_per_item(monkeypatch):
    wakes: list[int] = []

    class Counted(apart.ApartRun):
        def work(self) -> None:
            super().work()
            wakes.append(1)  # each thread wakes the loop once, as it leaves

    monkeypatch.setattr(apart, "ApartRun", Counted)
    calls: list[int] = []
    real = asyncio.Event.set

    def counted_set(self):
        calls.append(1)
        real(self)

    monkeypatch.setattr(asyncio.Event, "set", counted_set)
    assert _run(lambda p: [1.0], list(range(500)), workers=4, wait=True) == [1.0] * 500
    # each thread that ran woke the loop once as it left (on a loaded machine the first ones may
    # take all 500 items before the others start); a wake after the last result may never run
    assert 1 <= len(wakes) <= 4 and len(calls) <= len(wakes)


def test_a_cancelled_batch_takes_no_more_items():
    started: list[int] = []
    gate = threading.Event()

    def one(p):
        started.append(p)
        gate.wait(30)
        return [1.0]

    async def main():
        pool = ThreadPoolExecutor(max_workers=1)
        task = asyncio.create_task(apart.score_apart(pool, 1, one, list(range(10)), 60.0, check_value, "t"))
        while not started:
            await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        gate.set()
        pool.shutdown(wait=True)

    asyncio.run(main())
    assert started == [0]


def test_no_items_no_threads():
    assert _run(lambda p: [1.0], []) == []
    assert not isinstance(_run(lambda p: [0.5], ["x"])[0], ItemError)
