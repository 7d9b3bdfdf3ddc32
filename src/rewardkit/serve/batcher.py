"""Per-scorer dynamic batching: one queue, batches formed across requests, scorer off the loop.

Requests put items on the scorer's queue and await one future per item. A single worker task
takes the first waiting item, then keeps adding items until `max_batch_size` (or the token
budget) is reached or `max_wait_ms` has passed since that first item was queued, and runs the
scorer in a dedicated thread so the event loop keeps accepting requests meanwhile. While one
batch runs, the next one accumulates, so under load batches fill without waiting.

Failure contract: a NaN/inf or non-number becomes `non_finite`/`scorer_failed` for that item, an
exception becomes `scorer_failed` for every item of the batch; nothing is dropped, nothing is 0.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from rewardkit.serve.errors import ServeError
from rewardkit.serve.metrics import BatchStats, ServeMetrics, outcome
from rewardkit.serve.scorers.base import ItemError, ScoreItem, Scorer
from rewardkit.serve.timing import record_timing

log = logging.getLogger(__name__)

ItemResult = float | ItemError

BROKEN_AFTER = 3
"""Consecutive failed batches after which a scorer reports not ready (a success clears it)."""


@dataclass
class _Entry:
    item: ScoreItem
    future: asyncio.Future
    enqueued: float
    tokens: int | None
    started: float = field(default=0.0)


def check_value(value: object) -> ItemResult:
    """The one place a raw scorer output becomes a reward or an error."""
    if isinstance(value, ItemError):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        try:
            import numpy as np

            if isinstance(value, np.generic) and np.issubdtype(type(value), np.number):
                value = float(value)
            else:
                raise TypeError
        except (ImportError, TypeError):
            return ItemError("scorer_failed", f"scorer returned {type(value).__name__}, not a number")
    value = float(value)
    if not math.isfinite(value):
        return ItemError("non_finite", f"scorer produced {value}")
    return value


class DynamicBatcher:
    def __init__(
        self,
        scorer: Scorer,
        *,
        max_batch_size: int,
        max_wait_ms: float,
        max_queue: int,
        token_budget: int | None = None,
        queue_timeout_s: float = 30.0,
        metrics: ServeMetrics | None = None,
    ) -> None:
        self.scorer = scorer
        self.name = scorer.name
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self.token_budget = token_budget
        self.queue_timeout_s = queue_timeout_s
        self.metrics = metrics
        self.consecutive_failures = 0
        self._queue: collections.deque[_Entry] = collections.deque()
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        # One thread per scorer: models are not assumed thread-safe, and one forward at a time
        # per device is what saturates it anyway.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"scorer-{self.name}")

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def broken(self) -> bool:
        return self.consecutive_failures >= BROKEN_AFTER

    def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"batcher-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for entry in self._queue:
            if not entry.future.done():
                entry.future.set_exception(ServeError("not_ready", "service is shutting down"))
        self._queue.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def run_in_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def submit(self, items: list[ScoreItem]) -> list[ItemResult]:
        """Queue `items`, wait for their batches, return one result per item in order."""
        if self._task is None or self._wakeup is None:
            raise ServeError("not_ready", f"scorer {self.name!r} is not started")
        if len(self._queue) + len(items) > self.max_queue:
            retry = max(
                1.0, math.ceil(self.max_wait_s + len(self._queue) / max(1, self.max_batch_size) * 0.05)
            )
            raise ServeError(
                "queue_full",
                f"scorer {self.name!r} queue is full ({len(self._queue)} of {self.max_queue} items waiting)",
                retry_after=retry,
            )
        loop = asyncio.get_running_loop()
        now = time.perf_counter()
        entries = [
            _Entry(
                item, loop.create_future(), now, self.scorer.item_tokens(item) if self.token_budget else None
            )
            for item in items
        ]
        self._queue.extend(entries)
        self._set_depth()
        self._wakeup.set()
        try:
            results = await asyncio.gather(*(e.future for e in entries))
        except BaseException:
            for e in entries:  # a caller that went away must not leave work behind
                if not e.future.done():
                    e.future.cancel()
            raise
        record_timing(
            queue_s=max(e.started - e.enqueued for e in entries) if entries else 0.0,
            inference_s=max((r[1] for r in results), default=0.0),
        )
        return [r[0] for r in results]

    def _set_depth(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.labels(self.name).set(len(self._queue))

    def _expire(self) -> None:
        """Fail items that waited longer than the queue timeout (504), oldest first."""
        now = time.perf_counter()
        while self._queue and (
            self._queue[0].future.done() or now - self._queue[0].enqueued > self.queue_timeout_s
        ):
            entry = self._queue.popleft()
            if not entry.future.done():
                entry.future.set_exception(
                    ServeError(
                        "queue_timeout",
                        f"item waited over {self.queue_timeout_s:g}s in the {self.name!r} queue",
                    )
                )

    def _take(self) -> list[_Entry]:
        batch: list[_Entry] = []
        max_tokens = 0
        while self._queue and len(batch) < self.max_batch_size:
            entry = self._queue[0]
            if entry.future.done():  # cancelled by a caller that went away
                self._queue.popleft()
                continue
            if self.token_budget and entry.tokens is not None and batch:
                # Padded cost: every row of the batch is padded to the longest one.
                longest = max(max_tokens, entry.tokens)
                if longest * (len(batch) + 1) > self.token_budget:
                    break
            self._queue.popleft()
            batch.append(entry)
            max_tokens = max(max_tokens, entry.tokens or 0)
        return batch

    async def _run(self) -> None:
        assert self._wakeup is not None
        while True:
            self._expire()
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            deadline = self._queue[0].enqueued + self.max_wait_s
            while (
                len(self._queue) < self.max_batch_size and (remaining := deadline - time.perf_counter()) > 0
            ):
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except TimeoutError:
                    break
            self._expire()
            batch = self._take()
            self._set_depth()
            if batch:
                await self._score(batch)

    async def _score(self, batch: list[_Entry]) -> None:
        started = time.perf_counter()
        for e in batch:
            e.started = started
        items = [e.item for e in batch]
        order = list(range(len(items)))
        if self.token_budget:  # similar lengths together waste less padding inside the scorer
            order.sort(key=lambda i: batch[i].tokens or 0)
        try:
            raw = await self.run_in_thread(self.scorer.score_batch, [items[i] for i in order])
            if not isinstance(raw, list | tuple) or len(raw) != len(items):
                got = len(raw) if isinstance(raw, list | tuple) else type(raw).__name__
                raise RuntimeError(f"scorer returned {got} values for {len(items)} items")
            results: list[ItemResult] = [ItemError("scorer_failed", "unset")] * len(items)
            for pos, i in enumerate(order):
                results[i] = check_value(raw[pos])
            self.consecutive_failures = 0
        except Exception as exc:
            log.exception("scorer %s failed on a batch of %d", self.name, len(items))
            self.consecutive_failures += 1
            message = f"{type(exc).__name__}: {exc}"[:500]
            results = [ItemError("scorer_failed", message)] * len(items)
        elapsed = time.perf_counter() - started
        if self.metrics is not None:
            self.metrics.observe_batch(
                BatchStats(
                    scorer=self.name,
                    inference_s=elapsed,
                    queue_delays=tuple(e.started - e.enqueued for e in batch),
                    outcomes=tuple(outcome(r) for r in results),
                )
            )
        for e, r in zip(batch, results, strict=True):
            if not e.future.done():
                e.future.set_result((r, elapsed))
