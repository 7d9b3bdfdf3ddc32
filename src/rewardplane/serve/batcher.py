"""Per-scorer dynamic batching: one queue, batches formed across requests, scorer off the loop.

Requests put items on the scorer's queue and await one future per item. A single worker task
takes the first waiting item, then keeps adding items until `max_batch_size` (or the token
budget) is reached or `max_wait_ms` has passed since that first item was queued, and runs the
scorer in a dedicated thread so the event loop keeps accepting requests meanwhile. While one
batch runs, the next one accumulates, so under load batches fill without waiting. A scorer that
fans a batch out to a thread-safe pool of its own (`Scorer.concurrent_batches` > 1: the `math`
scorer's processes) gets up to that many batches at once, each from its own thread, so its pool
is not left idle behind one batch's slowest item, and skips the batch window while it has a
free slot (a fuller batch buys it nothing; the window would only add to every item's latency).

Items are admitted first (`serve/admission.py`: the contract every kind shares, by what the
scorer declares it reads: a missing response, text that cannot be encoded, the
`empty_response` policy), then prepared (`Scorer.prepare_many`: tokenisation, decoding; a
request's items together, so a scorer can share work across them), in a small thread pool, off
the event loop and off the scoring thread; an item refused or that cannot be prepared fails
alone there (or gets its fixed reward) and never reaches a batch. A scorer whose items must be
scored a group at a time (`Scorer.groups_in_one_batch`) never has a request's run of one
`group_id` split across two batches. A batch then holds up to `max_batch_size` items and, with a
token budget, up to that many tokens: the sum of its items' tokens for a padding-free scorer
(`packs_tokens`), rows x longest row for a padded one. Batches are taken in arrival order, so a
long item is never passed over by shorter ones behind it.

A scorer that declares a per-item deadline (`Scorer.item_deadline_s`: the rules, whose work is
linear over the item's text and releases the GIL) is scored item by item on its text threads:
an item still running at its deadline is a `timeout` error, and its batch-mates' results go back
without waiting for it. Admission of a request with much text (`ADMIT_ON_LOOP_CHARS`) runs in a
thread too, so no pass over item text, however linear, runs on the event loop.

Failure contract: a NaN/inf or non-number becomes `non_finite`/`scorer_failed` for that item. An
exception is retried on each half of the batch, down to single items, so only the items that
make the scorer raise get `scorer_failed`; nothing is dropped, nothing is 0.
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

from rewardplane.serve.admission import admitted
from rewardplane.serve.apart import outcome_of, run_one, score_apart
from rewardplane.serve.metrics import BatchStats, ServeMetrics, outcome
from rewardplane.serve.protocol import DetailedScore, ItemError, ScoreItem, ServeError
from rewardplane.serve.scorers.base import Scorer
from rewardplane.serve.timing import record_timing

log = logging.getLogger(__name__)

ItemResult = float | ItemError

BROKEN_AFTER = 3
"""Consecutive failed batches after which a scorer reports not ready (a success clears it)."""


PREPARE_WORKERS = 4
"""Admission threads per scorer. Fast tokenizers release the GIL while encoding."""

PREPARE_CHUNK = 32
"""Items prepared per task: large requests spread over the workers, small ones take one."""

TEXT_WORKERS = 4
"""Threads a scorer with a per-item deadline scores its items on, one item per call (`serve/apart.py`)."""

ADMIT_ON_LOOP_CHARS = 1 << 16
"""A request whose items hold more text than this is admitted in a thread, not on the loop."""

MAX_CONCURRENT_BATCHES = 8
"""Scoring threads a batcher may use: the most `Scorer.concurrent_batches` is honoured up to."""

PIPELINE_LEAD_S = 0.010
"""How long before the device is expected to free a queued-on-device scorer's next batch is
launched: its planning, copies and kernel launches happen while the current forward ends."""


class DeviceEstimate:
    """When a device that runs batches one after another (one CUDA stream) will be free, from
    the seconds per token learnt on completed batches (an exponential average)."""

    def __init__(self) -> None:
        self.per_token: float | None = None
        self.free_at = 0.0
        self._last_done = 0.0

    def launched(self, tokens: int, now: float) -> None:
        if self.per_token is not None:
            self.free_at = max(now, self.free_at) + tokens * self.per_token

    def finished(self, tokens: int, launched: float, now: float, *, idle: bool) -> None:
        """A batch launched at `launched` is back at `now`; it ran from when the batch before it
        ended (or from its launch, if the device was idle then)."""
        start = max(launched, self._last_done)
        if tokens > 0 and now > start:
            sample = (now - start) / tokens
            self.per_token = sample if self.per_token is None else 0.7 * self.per_token + 0.3 * sample
        self._last_done = now
        if idle:
            self.free_at = now


@dataclass(frozen=True)
class _Answered:
    """An item answered on admission without scoring: its `empty_response` fixed reward."""

    value: float


@dataclass
class _Entry:
    item: ScoreItem
    future: asyncio.Future
    enqueued: float
    tokens: int | None
    payload: object = None  # what Scorer.prepare returned for the item
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
    number = float(value)
    if not math.isfinite(number):
        return ItemError("non_finite", f"scorer produced {number}")
    if isinstance(value, DetailedScore) and value.detail:  # keeps its detail for the response
        return value
    return number


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
        # One batch at a time unless the scorer says otherwise (`Scorer.concurrent_batches`, read
        # per batch: a model scorer knows only once loaded whether it can pipeline). The bound on
        # batches in flight is the batcher's; the pool only supplies that many threads.
        self._in_flight: set[asyncio.Task] = set()
        self._device = DeviceEstimate()
        self._executor = ThreadPoolExecutor(
            max_workers=MAX_CONCURRENT_BATCHES, thread_name_prefix=f"scorer-{self.name}"
        )
        self._text_pool = (
            ThreadPoolExecutor(max_workers=TEXT_WORKERS, thread_name_prefix=f"text-{self.name}")
            if scorer.item_deadline_s is not None
            else None
        )
        kind = type(scorer)
        self._prepares = kind.prepare is not Scorer.prepare or kind.prepare_many is not Scorer.prepare_many
        self._prepare_pool = (
            ThreadPoolExecutor(max_workers=PREPARE_WORKERS, thread_name_prefix=f"prepare-{self.name}")
            if self._prepares
            else None
        )

    @property
    def _concurrency(self) -> int:
        return max(1, min(MAX_CONCURRENT_BATCHES, int(self.scorer.concurrent_batches)))

    @property
    def _fills_while_busy(self) -> bool:
        """Concurrent batches queue on one device (`Scorer.queues_on_device`): the next batch
        fills while the device is busy instead of leaving with whatever is queued."""
        return self._concurrency > 1 and self.scorer.queues_on_device

    def _budget_full(self) -> bool:
        """The queue already holds a full padding-free batch by the token budget."""
        if not (self.token_budget and self.scorer.packs_tokens):
            return False
        return sum(e.tokens or 0 for e in self._queue) >= self.token_budget

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
        for task in list(self._in_flight):
            task.cancel()
        for entry in self._queue:
            if not entry.future.done():
                entry.future.set_exception(ServeError("not_ready", "service is shutting down"))
        self._queue.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)
        for pool in (self._prepare_pool, self._text_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)

    async def run_in_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def submit(self, items: list[ScoreItem]) -> list[ItemResult]:
        """Queue `items`, wait for their batches, return one result per item in order."""
        if self._task is None or self._wakeup is None:
            raise ServeError("not_ready", f"scorer {self.name!r} is not started")
        if len(items) > self.max_queue:  # no wait can make room: 413, not a 429 to retry forever
            raise ServeError(
                "too_large",
                f"{len(items)} items can never fit scorer {self.name!r}'s queue of {self.max_queue}; "
                "split the request",
            )
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
        payloads = await self._prepare_all(items)
        now = time.perf_counter()
        entries = [
            _Entry(i, loop.create_future(), now, self._tokens(i, p), p)
            for i, p in zip(items, payloads, strict=True)
        ]
        queued = []
        for e in entries:
            if isinstance(e.payload, ItemError | _Answered):  # answered on admission: no batch
                e.started = now
                e.future.set_result((getattr(e.payload, "value", e.payload), 0.0))
            else:
                queued.append(e)
        self._queue.extend(queued)
        self._set_depth()
        self._wakeup.set()
        try:
            results = await asyncio.gather(*(e.future for e in entries))
        except BaseException:
            for e in queued:  # a caller that went away must not leave work behind
                if not e.future.done():
                    e.future.cancel()
            raise
        record_timing(
            queue_s=max((e.started - e.enqueued for e in entries), default=0.0),
            inference_s=max((r[1] for r in results), default=0.0),
        )
        return [r[0] for r in results]

    async def _prepare_all(self, items: list[ScoreItem]) -> list[object]:
        """The admission contract, then `Scorer.prepare` for every admitted item, on the
        admission threads (a scorer that prepares nothing: admission only, on the loop, and the
        item is its own payload). A prepare that raises fails its item as `bad_input`."""
        if self._prepare_pool is None:
            if _text_chars(items) <= ADMIT_ON_LOOP_CHARS:
                return admitted(self.scorer, items, list, _Answered)
            return await asyncio.to_thread(admitted, self.scorer, items, list, _Answered)
        loop = asyncio.get_running_loop()
        chunks = [items[i : i + PREPARE_CHUNK] for i in range(0, len(items), PREPARE_CHUNK)]
        done = await asyncio.gather(
            *(loop.run_in_executor(self._prepare_pool, self._admit_chunk, c) for c in chunks)
        )
        return [p for chunk in done for p in chunk]

    def _admit_chunk(self, items: list[ScoreItem]) -> list[object]:
        return admitted(self.scorer, items, self._prepare_chunk, _Answered)

    def _prepare_chunk(self, items: list[ScoreItem]) -> list[object]:
        try:
            out = self.scorer.prepare_many(items)
            if isinstance(out, list) and len(out) == len(items):
                return out
        except Exception:  # one item spoiled the shared call: one by one, so only it fails
            pass
        out = []
        for item in items:
            try:
                out.append(self.scorer.prepare(item))
            except Exception as exc:  # the item, not the service, is at fault
                out.append(ItemError("bad_input", f"{type(exc).__name__}: {exc}"[:500]))
        return out

    def _tokens(self, item: ScoreItem, payload: object) -> int | None:
        if not self.token_budget or isinstance(payload, ItemError):
            return None
        exact = self.scorer.prepared_tokens(payload) if self._prepares else None
        return exact if exact is not None else self.scorer.item_tokens(item)

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

    def _group_run(self, group_id: str) -> int:
        """How many queued entries, from the head, belong to `group_id` (one request's run)."""
        n = 0
        for entry in self._queue:
            if entry.item.group_id != group_id:
                break
            n += 1
        return n

    def _take(self) -> list[_Entry]:
        batch: list[_Entry] = []
        max_tokens = total_tokens = 0
        packed = self.scorer.packs_tokens
        whole_groups = self.scorer.groups_in_one_batch
        while self._queue and len(batch) < self.max_batch_size:
            entry = self._queue[0]
            if entry.future.done():  # cancelled by a caller that went away
                self._queue.popleft()
                continue
            gid = entry.item.group_id
            starts_group = whole_groups and batch and gid is not None and gid != batch[-1].item.group_id
            if starts_group and len(batch) + self._group_run(gid) > self.max_batch_size:
                break  # the next group starts the next batch, whole
            if self.token_budget and entry.tokens is not None and batch:
                if packed:  # padding-free: the batch costs its tokens
                    cost = total_tokens + entry.tokens
                else:  # padded: every row costs the longest one
                    cost = max(max_tokens, entry.tokens) * (len(batch) + 1)
                if cost > self.token_budget:
                    break
            self._queue.popleft()
            batch.append(entry)
            max_tokens = max(max_tokens, entry.tokens or 0)
            total_tokens += entry.tokens or 0
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
            busy = bool(self._in_flight)
            if self._concurrency > 1 and len(self._in_flight) < self._concurrency:
                if not self._fills_while_busy:
                    # A scorer whose free slot is an idle pool gains nothing from a fuller batch
                    # (the pool runs items one by one): what is queued now goes now.
                    deadline = self._queue[0].enqueued
                elif busy:
                    # One device, busy: the next batch fills until it is full or the device is
                    # about to free, then launches behind the running one (no gap, no fragment).
                    deadline = max(deadline, self._device.free_at - PIPELINE_LEAD_S)
            while (
                len(self._queue) < self.max_batch_size
                and not (self._fills_while_busy and (self._budget_full() or (busy and not self._in_flight)))
                and (remaining := deadline - time.perf_counter()) > 0
            ):
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except TimeoutError:
                    break
            self._expire()
            batch = self._take()
            self._set_depth()
            if not batch:
                continue
            if self._concurrency == 1:
                await self._score(batch)
                continue
            task = asyncio.get_running_loop().create_task(self._score(batch))
            self._in_flight.add(task)
            task.add_done_callback(self._batch_done)
            if len(self._in_flight) >= self._concurrency:
                await asyncio.wait(self._in_flight, return_when=asyncio.FIRST_COMPLETED)

    def _batch_done(self, task: asyncio.Task) -> None:
        """A concurrent batch is back: its slot is free, and a batch filling behind it re-checks
        (the device may now be idle)."""
        self._in_flight.discard(task)
        if self._wakeup is not None:
            self._wakeup.set()

    async def _score(self, batch: list[_Entry]) -> None:
        started = time.perf_counter()
        for e in batch:
            e.started = started
        batch_tokens = sum(e.tokens or 0 for e in batch)
        self._device.launched(batch_tokens, started)
        payloads = [e.payload for e in batch]
        order = list(range(len(payloads)))
        if self.token_budget and not self.scorer.packs_tokens:
            order.sort(key=lambda i: batch[i].tokens or 0)  # similar lengths pad less
        tokens: dict[str, int] = {}
        if self.scorer.item_deadline_s is not None:
            ordered = await self._score_apart([payloads[i] for i in order], self.scorer.item_deadline_s)
        else:
            ordered = await self._score_or_bisect([payloads[i] for i in order], tokens)
        results: list[ItemResult] = [ItemError("scorer_failed", "unset")] * len(payloads)
        for pos, i in enumerate(order):
            results[i] = ordered[pos]
        if any(not isinstance(r, ItemError) or r.code != "scorer_failed" for r in results):
            self.consecutive_failures = 0
        else:
            self.consecutive_failures += 1
        done = time.perf_counter()
        elapsed = done - started
        self._device.finished(batch_tokens, started, done, idle=len(self._in_flight) <= 1)
        if self.metrics is not None:
            self.metrics.observe_batch(
                BatchStats(
                    scorer=self.name,
                    inference_s=elapsed,
                    queue_delays=tuple(e.started - e.enqueued for e in batch),
                    outcomes=tuple(outcome(r) for r in results),
                    tokens=tokens,
                )
            )
        for e, r in zip(batch, results, strict=True):
            if not e.future.done():
                e.future.set_result((r, elapsed))

    def _score_with_stats(self, payloads: list[object]) -> tuple[object, dict[str, int]]:
        """`score_prepared` and the token accounting of that very call, read in the same scoring
        thread (with batches in flight on several threads, a later read could see another's)."""
        raw = self.scorer.score_prepared(payloads)
        return raw, self.scorer.take_batch_stats()

    async def _score_or_bisect(self, payloads: list[object], tokens: dict[str, int]) -> list[ItemResult]:
        """Score a batch; if the scorer raises, score each half again, down to single items, so
        only the items that make it raise fail (`scorer_failed`) and their batch-mates score.
        The token accounting of every call that ran is added into `tokens`."""
        try:
            raw, stats = await self.run_in_thread(self._score_with_stats, payloads)
            for key, value in stats.items():
                tokens[key] = tokens.get(key, 0) + value
            if not isinstance(raw, list | tuple) or len(raw) != len(payloads):
                got = len(raw) if isinstance(raw, list | tuple) else type(raw).__name__
                raise RuntimeError(f"scorer returned {got} values for {len(payloads)} items")
            return [check_value(v) for v in raw]
        except Exception as exc:
            if len(payloads) == 1:
                log.warning("scorer %s failed on an item: %s: %s", self.name, type(exc).__name__, exc)
                return [ItemError("scorer_failed", f"{type(exc).__name__}: {exc}"[:500])]
            log.warning("scorer %s failed on a batch of %d; retrying its halves", self.name, len(payloads))
            half = len(payloads) // 2
            return [
                *await self._score_or_bisect(payloads[:half], tokens),
                *await self._score_or_bisect(payloads[half:], tokens),
            ]

    async def _score_apart(self, payloads: list[object], deadline_s: float) -> list[ItemResult]:
        """Each item in its own `score_prepared` call on the text threads, under its own deadline
        (`serve/apart.py`)."""
        assert self._text_pool is not None
        return await score_apart(
            self._text_pool, TEXT_WORKERS, self._score_one, payloads, deadline_s, check_value, self.name
        )

    def _score_one(self, payload: object) -> object:
        return self.scorer.score_prepared([payload])

    def score_inline(self, items: list[ScoreItem]) -> list[ItemResult]:
        """Admit, prepare and score `items` in the calling thread, without the queue:
        for a caller already in a thread and off every response's path (the audit's rule
        auditors, `serve/audit/stream.py`), to which a batch through the queue and the text
        threads costs more handoffs than the rules' own work. No per-item deadline: the rules
        are linear, and only that caller's thread waits."""
        return admitted(self.scorer, items, self._score_each)

    def _score_each(self, items: list[ScoreItem]) -> list[ItemResult]:
        """One `score_prepared` call for all the prepared items; if it raises or miscounts,
        each item alone, so only the items that fail it fail."""
        payloads = self._prepare_chunk(items) if self._prepares else items
        todo = [p for p in payloads if not isinstance(p, ItemError)]
        raw = run_one(self.scorer.score_prepared, todo)
        if isinstance(raw, list | tuple) and len(raw) == len(todo):
            scored = [check_value(v) for v in raw]
        else:
            scored = [outcome_of(run_one(self._score_one, p), check_value, self.name) for p in todo]
        it = iter(scored)
        return [p if isinstance(p, ItemError) else next(it) for p in payloads]  # type: ignore[misc]


def _text_chars(items: list[ScoreItem]) -> int:
    """How much text `items` hold (string lengths are free to read; a message list counts its
    contents)."""
    total = 0
    for item in items:
        for value in (item.prompt, item.response, item.reference):
            if isinstance(value, str):
                total += len(value)
            elif isinstance(value, list):
                total += sum(len(m.get("content") or "") for m in value if isinstance(m, dict))
    return total
