"""Scoring a batch item by item under a per-item deadline (`Scorer.item_deadline_s`).

Up to `workers` text threads each take the next item not yet started, score it alone
(`score_prepared([payload])`), and go on to the next, so one slow item holds one thread and
never its batch-mates. The event loop is woken only when a thread runs out of items or when a
running item may have passed its deadline — a few times a batch, not once an item: a handoff
to a thread and back for every item costs more than scoring a rule does.

An item still running at its deadline is a `timeout` error; its thread finishes it on its own
(the rules' work is linear and releases the GIL) and takes nothing more from that batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor

from rewardplane.serve.protocol import ItemError

log = logging.getLogger(__name__)

_RUNNING = object()
"""An item's outcome while its thread scores it."""


class ApartRun:
    """One batch scored apart: the threads' shared state (next item, starts, outcomes)."""

    def __init__(self, score_one: Callable[[object], object], payloads: list[object]) -> None:
        self.score_one = score_one
        self.payloads = payloads
        self.starts: list[float | None] = [None] * len(payloads)
        self.outcomes: list[object] = [_RUNNING] * len(payloads)
        self._next = 0
        self._lock = threading.Lock()
        self.stopped = False
        self.wake: Callable[[], None] = lambda: None

    def _take(self) -> int | None:
        with self._lock:
            if self.stopped or self._next >= len(self.payloads):
                return None
            i, self._next = self._next, self._next + 1
            self.starts[i] = time.perf_counter()
            return i

    def work(self) -> None:
        """A text thread: score items until none is left, then wake the loop once."""
        try:
            while (i := self._take()) is not None:
                self.outcomes[i] = run_one(self.score_one, self.payloads[i])
        finally:
            self.wake()


def run_one(score_one: Callable[[object], object], payload: object) -> object:
    """`score_one(payload)`'s raw answer, or the exception it raised (this item's failure, not
    its batch-mates')."""
    try:
        return score_one(payload)
    except Exception as exc:
        return exc


async def score_apart(
    pool: Executor,
    workers: int,
    score_one: Callable[[object], object],
    payloads: list[object],
    deadline_s: float,
    check: Callable[[object], object],
    name: str,
) -> list[object]:
    """Each payload's outcome through `check` (a value, or an `ItemError`): `timeout` for an item
    that ran past `deadline_s` counted from its own start, `scorer_failed` for one that raised."""
    loop = asyncio.get_running_loop()
    woken = asyncio.Event()
    run = ApartRun(score_one, payloads)
    run.wake = lambda: loop.call_soon_threadsafe(woken.set)
    for _ in range(min(workers, len(payloads))):
        pool.submit(run.work)
    late: set[int] = set()
    try:
        while True:
            woken.clear()  # before reading the threads' state: a wake after the read is not lost
            now = time.perf_counter()
            running = [i for i, o in enumerate(run.outcomes) if o is _RUNNING and i not in late]
            for i in running:
                if (s := run.starts[i]) is not None and now - s >= deadline_s:
                    late.add(i)
                    log.warning("scorer %s: an item ran past its %gs deadline", name, deadline_s)
            started = [s for i in running if i not in late and (s := run.starts[i]) is not None]
            if len(late) + sum(o is not _RUNNING for o in run.outcomes) >= len(payloads):
                break
            wait = min((s + deadline_s - now for s in started), default=deadline_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), max(wait, 0.0))
    finally:
        run.stopped = True  # a cancelled batch's threads take nothing more
    timeout = ItemError("timeout", f"scoring the item took over its {deadline_s:g}s deadline")
    return [timeout if i in late else outcome_of(o, check, name) for i, o in enumerate(run.outcomes)]


def outcome_of(raw: object, check: Callable[[object], object], name: str) -> object:
    """A one-item call's answer (`run_one`) as that item's result: `check` of its one value, or
    `scorer_failed` for an exception or anything but one value."""
    if isinstance(raw, Exception):
        log.warning("scorer %s failed on an item: %s: %s", name, type(raw).__name__, raw)
        return ItemError("scorer_failed", f"{type(raw).__name__}: {raw}"[:500])
    if not isinstance(raw, list | tuple) or len(raw) != 1:
        return ItemError("scorer_failed", "scorer did not return one value for one item")
    return check(raw[0])
