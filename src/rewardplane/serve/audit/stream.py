"""The audit stream: a sample of the proxy's scored items, re-scored by the auditors off the
critical path (docs/audit.md).

`observe` is all the request path ever runs: the sampler's pick of the request (`sampler.py`:
one version parse per distinct raw version, one keyed hash per group and version, nothing per
unsampled item beyond C-level passes and a counter) and, for a sampled item, a `put_nowait` on
a bounded queue. It never awaits,
never raises into the request and never blocks: a full queue (by items or by bytes) drops the
item and counts it. Worker tasks drain the queue in batches, score each batch with every
auditor (a hosted scorer through the backend, or another service over HTTP), and hand the
results to the ledger in a thread (statistics are CPU work); a hosted text rule is scored in
that same thread, without its queue (`InProcessBackend.inline_scorer`) — so neither a slow
auditor nor the statistics can delay or fail a proxy response; at worst audit items are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rewardplane import __version__
from rewardplane.core import atomic
from rewardplane.serve.audit.alarms import Decision, watching
from rewardplane.serve.audit.config import AuditConfig, ExternalAuditor
from rewardplane.serve.audit.ledger import NO_SOURCE, Audited, Ledger
from rewardplane.serve.audit.metrics import AuditMetrics
from rewardplane.serve.audit.sampler import Sampler, Taken
from rewardplane.serve.audit.signatures import SIGNATURES, batch_signatures
from rewardplane.serve.protocol.audit import flat_counts, flat_metrics
from rewardplane.serve.scorers.base import ItemError, ScoreItem
from rewardplane.serve.scorers.common import as_text

log = logging.getLogger(__name__)

SCHEMA = "rewardplane.audit/1"
AUDIT_FILE = "audit.json"
WRITE_EVERY_S = 10.0
"""`audit.json` is rewritten at most this often as bins close (each write holds every version's
summary: per bin it would be O(versions)), and always when the stream drains or stops."""


@dataclass(frozen=True)
class _Job:
    item: ScoreItem
    epoch: int
    version: int
    source: str
    proxy: float
    size: int


def _size(item: ScoreItem) -> int:
    text = as_text(item.prompt) if item.prompt else ""
    return len(text) + len(as_text(item.response) if item.response else "") + len(item.image or b"") + 256


class _Hosted:
    """An auditor this service hosts: scored through the backend, as a request would be, or,
    for a text rule, in the thread that records the batch (`inline`)."""

    def __init__(self, name: str, backend: Any) -> None:
        self.name = name
        self.backend = backend

    def inline(self) -> Any:
        """The backend's call for scoring this auditor in the calling thread, or None (asked at
        each batch: the scorer may have been loaded, replaced or removed since)."""
        inline_scorer = getattr(self.backend, "inline_scorer", None)
        return inline_scorer(self.name) if inline_scorer is not None else None

    async def score(self, items: list[ScoreItem]) -> list[Any]:
        return await self.backend.score(self.name, items)

    async def close(self) -> None:
        pass


class _Remote:
    """An auditor on another rewardplane service (`POST /v1/score`), one retry at most."""

    def __init__(self, spec: ExternalAuditor) -> None:
        from rewardplane.serve.client import AsyncRewardClient

        self.name = spec.label()
        self.scorer = spec.scorer
        token = os.environ.get(spec.token_env) if spec.token_env else None
        self.client = AsyncRewardClient(
            spec.url, token=token, timeout=spec.timeout_s, max_retries=1, allow_partial=True
        )

    async def score(self, items: list[ScoreItem]) -> list[Any]:
        # a failed item has no score: None, which the stream counts as that auditor's failure
        return [r.scores.get(self.scorer) for r in await self.client.score(items, [self.scorer])]

    async def close(self) -> None:
        await self.client.aclose()

    def inline(self) -> None:
        return None


class AuditStream:
    def __init__(
        self,
        config: AuditConfig,
        backend: Any,
        metrics: AuditMetrics | None = None,
        *,
        secret: bytes | None = None,
    ) -> None:
        """`secret` keys the sampling; random at every start unless given (benchmarks that must
        repeat a run give one). It is never exposed: which groups are audited cannot be known
        or chosen by a client."""
        self.config = config
        self.backend = backend
        self.metrics = metrics
        self.ledgers: dict[int, Ledger] = {0: Ledger(config, 0)}
        self.auditors = [_Hosted(a, backend) if isinstance(a, str) else _Remote(a) for a in config.auditors]
        self.counts: dict[str, int] = {}
        self.auditor_errors: dict[str, int] = {a.name: 0 for a in self.auditors}
        self._queue: asyncio.Queue[_Job] | None = None
        self._full = asyncio.Event()  # set when a full batch is waiting
        self._bytes = 0
        self.sampler = Sampler(config, secret if secret is not None else secrets.token_bytes(32))
        self._counts_lock = threading.Lock()  # counts: added on the loop and in the recording threads
        if metrics is not None:  # read when scraped: the rate in force, an epoch's boost included
            metrics.bind(
                lambda: self._locked(self.counts),
                lambda: self._locked(self.auditor_errors),
                lambda: self._queue.qsize() if self._queue is not None else 0,
                lambda: self.sampler.rate,
            )
        self._lock = threading.Lock()  # the ledger: recorded in worker threads, read by snapshots
        self._tasks: list[asyncio.Task] = []
        self._firing: set[tuple[str, str]] = set()
        self._watch = (0, config.boost.hold_bins)  # (epoch, bins the boost still lasts)
        self._written = -math.inf  # monotonic time of the last audit.json write
        self._unwritten = False  # a bin closed since
        self.flat: dict[str, float] = {}
        """The newest numbers as trainers log them (`serve.protocol.audit.flat_metrics`), refreshed per batch."""

    # ------------------------------------------------------------------ the request path

    def observe(self, names: list[str], items: list[ScoreItem], results: dict[str, list[Any]]) -> None:
        """Offer the proxy's scored items to the audit. Never blocks, never raises."""
        try:
            if self.config.proxy in results and self._queue is not None:
                self._offer(items, results[self.config.proxy])
        except Exception:  # the audit must never fail a response
            log.exception("audit: observe failed; items not audited")

    def _offer(self, items: list[ScoreItem], values: list[Any]) -> None:
        """The sampler's pick of this request (per request and per (version, group), an item
        one by one only when sampled); counters added once per request."""
        counts: dict[str, int] = {}
        sampled = self.sampler.take(items, values, counts)
        if sampled:
            self._enqueue(sampled, counts)
        if counts:
            self._add(counts)

    def _enqueue(self, sampled: list[Taken], counts: dict[str, int]) -> None:
        queue = self._queue
        assert queue is not None
        cfg = self.config
        counts["sampled"] = len(sampled)
        for item, epoch, version, value in sampled:
            meta = item.metadata
            source = str(meta.get(cfg.source_key) or NO_SOURCE)[:128] if meta else NO_SOURCE
            job = _Job(item, epoch, version, source, float(value), _size(item))
            if self._bytes + job.size > cfg.queue_bytes:
                counts["dropped_queue_bytes"] = counts.get("dropped_queue_bytes", 0) + 1
                continue
            try:
                queue.put_nowait(job)
            except asyncio.QueueFull:
                counts["dropped_queue_full"] = counts.get("dropped_queue_full", 0) + 1
                continue
            self._bytes += job.size
            if queue.qsize() >= cfg.batch_size - 1:
                self._full.set()  # a worker holding one item has a full batch waiting

    def _count(self, outcome: str, n: int = 1) -> None:
        self._add({outcome: n})

    def _add(self, counts: dict[str, int]) -> None:
        with self._counts_lock:  # counted on the loop and in the recording threads
            for outcome, n in counts.items():
                self.counts[outcome] = self.counts.get(outcome, 0) + n

    def _locked(self, totals: dict[str, int]) -> dict[str, int]:
        """A copy of running totals, for a reader in another thread (a /metrics scrape)."""
        with self._counts_lock:
            return dict(totals)

    # ------------------------------------------------------------------ the workers

    async def start(self) -> None:
        self._queue = asyncio.Queue(maxsize=self.config.queue)
        self._tasks = [
            asyncio.create_task(self._work(), name=f"audit-worker-{i}")
            for i in range(self.config.concurrency)
        ]
        if self.config.out:
            self._tasks.append(asyncio.create_task(self._flush_every(), name="audit-flush"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        self._tasks = []
        await asyncio.to_thread(self.flush)  # whatever was recorded reaches audit.json
        for auditor in self.auditors:
            with contextlib.suppress(Exception):
                await auditor.close()

    async def _work(self) -> None:
        queue = self._queue
        assert queue is not None
        size, wait = self.config.batch_size, self.config.batch_wait_s
        while True:
            batch = [await queue.get()]
            # fill the batch for up to batch_wait_s: an auditor's forward of 2 items costs
            # nearly what one of 32 does, and audit items are not waited for by anyone. The
            # worker sleeps until `_offer` says a batch is there or the time is up: no polling
            if wait > 0 and queue.qsize() < size - 1:
                self._full.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), wait)
            while len(batch) < size and not queue.empty():
                batch.append(queue.get_nowait())
            self._bytes -= sum(job.size for job in batch)
            try:
                await self._audit(batch)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("audit: a batch of %d items failed; dropped", len(batch))
                self._count("auditor_failed", len(batch))
            finally:
                for _ in batch:
                    queue.task_done()

    async def drain(self) -> None:
        """Wait until every queued item has been audited and recorded, and written to
        `audit.json` when `out` is set (tests, benchmarks)."""
        if self._queue is not None:
            await self._queue.join()
        await asyncio.to_thread(self.flush)

    async def _audit(self, batch: list[_Job]) -> None:
        """Score the batch with every auditor and record it: the auditors scored through a
        backend or over HTTP here, concurrently; then one thread scores the text rules inline
        (no queue, no handoff per item), passes over the texts and records, so a batch costs
        one thread handoff however many rule auditors there are."""
        items = [job.item for job in batch]
        inline = {a.name: call for a in self.auditors if (call := a.inline()) is not None}
        awaited = [a for a in self.auditors if a.name not in inline]
        scored = dict(
            zip(
                [a.name for a in awaited],
                await asyncio.gather(*(self._score(a, items) for a in awaited)),
                strict=True,
            )
        )
        await asyncio.to_thread(self._finish, batch, scored, inline)

    def _finish(self, batch: list[_Job], scored: dict[str, list[float]], inline: dict[str, Any]) -> None:
        """In a thread: the inline auditors' scores, the text passes, and the record."""
        items = [job.item for job in batch]
        for name, call in inline.items():
            try:
                results = call(items)
            except Exception as exc:
                log.warning("audit: auditor %s failed a batch of %d: %s", name, len(items), exc)
                results = [None] * len(items)
            scored[name] = self._values(name, len(items), results)
        texts = [as_text(job.item.response) if job.item.response else "" for job in batch]
        masks, lengths = _text_passes(texts, self.config.length_unit == "words")
        audited: list[Audited] = []
        failed = 0
        cap = self.config.length_cap
        for i, job in enumerate(batch):
            values = {a.name: scored[a.name][i] for a in self.auditors}
            if all(math.isnan(v) for v in values.values()):
                failed += 1
                continue
            length = lengths[i]
            truncated = (job.item.metadata or {}).get("truncated")
            at_cap = truncated if isinstance(truncated, bool) else (cap is not None and length >= cap)
            audited.append(
                Audited(job.version, job.source, job.proxy, values, length, at_cap, masks[i], job.epoch)
            )
        if failed:
            self._count("auditor_failed", failed)
        if audited:
            self._count("audited", len(audited))
            self._record(audited)

    async def _score(self, auditor: Any, items: list[ScoreItem]) -> list[float]:
        """One value per item, NaN where the auditor failed (counted per auditor)."""
        try:
            results = await asyncio.wait_for(auditor.score(items), self.config.timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("audit: auditor %s failed a batch of %d: %s", auditor.name, len(items), exc)
            results = [None] * len(items)
        return self._values(auditor.name, len(items), results)

    def _values(self, name: str, n: int, results: list[Any]) -> list[float]:
        """An auditor's results as floats, NaN for each failed item (counted for that auditor)."""
        out = []
        for r in results if len(results) == n else [None] * n:
            ok = isinstance(r, float) and not isinstance(r, ItemError) and math.isfinite(r)
            out.append(float(r) if ok else math.nan)
        errors = sum(math.isnan(v) for v in out)
        if errors:
            with self._counts_lock:
                self.auditor_errors[name] += errors
        return out

    @property
    def ledger(self) -> Ledger:
        """The current epoch's ledger."""
        return self.ledgers[max(self.ledgers)]

    def _ledger(self, epoch: int) -> Ledger | None:
        """The ledger of `epoch`, opened when it is new (every older epoch then ends: all its
        versions are final); None for an epoch already let go."""
        if epoch in self.ledgers:
            return self.ledgers[epoch]
        if epoch < max(self.ledgers):
            return None
        for old in self.ledgers.values():
            self._decided(old.settle(ended=True))
        self.ledgers[epoch] = Ledger(self.config, epoch)
        for old in sorted(self.ledgers)[: -self.config.keep_epochs]:
            del self.ledgers[old]
        return self.ledgers[epoch]

    def _record(self, audited: list[Audited]) -> None:
        with self._lock:
            bins = {e: len(book.closed) for e, book in self.ledgers.items()}
            for epoch in sorted({a.epoch for a in audited}):
                book = self._ledger(epoch)
                if book is None:
                    continue
                late = book.late
                book.record([a for a in audited if a.epoch == epoch])
                if book.late > late:
                    self._count("late", book.late - late)
                decisions = book.settle()
                self._decided(decisions)
                if book is self.ledger:
                    self._adapt(book, decisions)
            closed = [
                book.bin_summary(i, intervals=False)
                for e, book in self.ledgers.items()
                for i in range(bins.get(e, 0), len(book.closed))
            ]
            if self.metrics is not None:
                for summary in closed:
                    self.metrics.observe_bin(summary)
            if closed or not self.flat:  # the newest bin as it closed: no interval is computed for it
                book = self.ledger
                last = [book.bin_summary(len(book.closed) - 1, intervals=False)] if book.closed else []
                body = {"counts": self.counts, "epoch": book.epoch, "bins": last, "alarms": book.alarms}
                self.flat = flat_metrics(body)  # non-finite numbers are left out
            else:  # only the counters moved: no snapshot per batch
                self.flat = {**self.flat, **flat_counts(self.counts)}
            if closed and self.config.out:
                self._unwritten = True
                if time.monotonic() - self._written >= WRITE_EVERY_S:
                    self._write(Path(self.config.out))

    def _decided(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            key = (decision.alarm, decision.subject)
            if decision.fired and key not in self._firing:
                _log_alarm(decision)  # once as it starts firing, not at every bin it fires
            (self._firing.add if decision.fired else self._firing.discard)(key)

    def _adapt(self, book: Ledger, decisions: list[Decision]) -> None:
        """The boost (adaptive sampling), at each closed bin of the current epoch: watching lasts
        `hold_bins` more bins after a decision that calls for it (`alarms.watching`), and an
        epoch starts watching — until the alarm decides, nothing says the run is calm, and the
        first versions are where a run climbs fastest. The sampler samples `sample` × `factor`
        while watching, `sample` otherwise."""
        cfg = self.config
        if cfg.boost.factor <= 1:
            return
        epoch, left = self._watch
        if epoch != book.epoch:
            left = cfg.boost.hold_bins
        for b in sorted({d.bin for d in decisions if d.alarm == "overoptimization"}):
            hit = any(watching(d, cfg.boost) for d in decisions if d.bin == b)
            left = cfg.boost.hold_bins if hit else max(0, left - 1)
        self._watch = (book.epoch, left)
        rate = self.sampler.boosted if left else cfg.sample
        if rate != self.sampler.rate:
            log.info("audit: sampling %g of the proxy's items from now on", rate)
            self.sampler.rate = rate

    def _write(self, out: Path) -> None:
        """Rewrite `audit.json` (under the lock): every version's summary, read (and so computed)
        here if no one has read it yet."""
        self._written, self._unwritten = time.monotonic(), False
        try:
            body = clean(self._snapshot(summary=False, since=None))
            atomic.write_text(out / AUDIT_FILE, json.dumps(body, allow_nan=False, indent=1) + "\n")
        except OSError as exc:
            log.warning("audit: could not write %s: %s", out / AUDIT_FILE, exc)

    def flush(self) -> None:
        """Write `audit.json` now if a bin closed since it was last written (a thread's work)."""
        with self._lock:
            if self._unwritten and self.config.out:
                self._write(Path(self.config.out))

    async def _flush_every(self) -> None:
        """Bins closed within `WRITE_EVERY_S` of the last write reach the file at most that much later."""
        while True:
            await asyncio.sleep(WRITE_EVERY_S)
            await asyncio.to_thread(self.flush)

    # ------------------------------------------------------------------ reading

    async def snapshot(self, *, summary: bool = False, since: int | None = None) -> dict[str, Any]:
        """`GET /v1/audit`: counters, alarms, closed bins and versions (docs/audit.md)."""
        return await asyncio.to_thread(self._locked_snapshot, summary, since)

    def _locked_snapshot(self, summary: bool, since: int | None) -> dict[str, Any]:
        with self._lock:
            return clean(self._snapshot(summary=summary, since=since))

    def _snapshot(self, *, summary: bool, since: int | None) -> dict[str, Any]:
        """The body of `GET /v1/audit` (the bins it holds get their intervals computed now, once)."""
        cfg = self.config
        ledger = self.ledger
        counts = {**dict.fromkeys(("sampled", "audited", "dropped_queue_full", "dropped_queue_bytes",
                                   "auditor_failed", "unversioned", "bad_version", "late"), 0), **self.counts}  # fmt: skip
        body: dict[str, Any] = {
            "schema": SCHEMA,
            "rewardplane_version": __version__,
            "proxy": cfg.proxy,
            "auditors": cfg.auditor_names(),
            "signatures": list(SIGNATURES),
            "settings": cfg.model_dump(mode="json", exclude={"auditors"}),
            "counts": counts,
            "auditor_errors": dict(self.auditor_errors),
            "queue_depth": self._queue.qsize() if self._queue is not None else 0,
            "epoch": ledger.epoch,
            "epochs": [_epoch_row(book) for _, book in sorted(self.ledgers.items())],
            "newest_version": ledger.newest if ledger.newest >= 0 else None,
            "binned_through": ledger.binned_through if ledger.binned_through >= 0 else None,
            "evidence": evidence(ledger),
            "sample_rate": self.sampler.rate,
            "alarms": ledger.alarms,
        }
        books = [book for _, book in sorted(self.ledgers.items())]
        picked = [(book, i) for book in books for i in range(len(book.closed))]
        if summary:
            picked = [(ledger, len(ledger.closed) - 1)] if ledger.closed else []
        if since is not None:
            picked = [(book, i) for book, i in picked if book.closed[i].summary["versions"][1] >= since]
        body["bins"] = [book.bin_summary(i) for book, i in picked]
        if not summary:
            body["versions"] = [
                {"epoch": book.epoch, **v} for book in books for v in book.snapshot_versions(since)
            ]
        return body


def _epoch_row(book: Ledger) -> dict[str, Any]:
    """One epoch: its versions, bins, and each alarm's first firing in it."""
    first = {f"{alarm}:{subject}": entry["first_fired_versions"] for alarm, subjects in book.alarms.items()
             for subject, entry in subjects.items() if entry["first_fired_versions"]}  # fmt: skip
    versions = [*book.versions, *book.aged]
    return {
        "epoch": book.epoch,
        "versions": [min(versions), max(versions)] if versions else None,
        "bins": len(book.closed),
        "first_fired": first,
    }


def evidence(book: Ledger) -> str:
    """Whether this epoch's bins can decide within `max_bin_versions` versions: "sufficient: …" or
    "insufficient: N audited items a version, needs M", in words, from its newest final versions."""
    cfg = book.config
    needs = math.ceil(cfg.min_items / cfg.max_bin_versions)
    final = sorted(v for v in (*book.versions, *book.aged) if v <= book.binned_through)[-8:]
    if not final:
        return f"unknown: no final version yet; needs {needs} audited items a version"
    per_version = sum(book.recorded(v) for v in final) / (final[-1] - final[0] + 1)
    if per_version < needs:
        return (
            f"insufficient: {per_version:.1f} audited items a version, needs {needs} (min_items "
            f"{cfg.min_items} within max_bin_versions {cfg.max_bin_versions}): raise sample by "
            f"{needs / max(per_version, 1e-9):.1f}x, or lower min_items"
        )
    return f"sufficient: {per_version:.1f} audited items a version, needs {needs}"


def _text_passes(texts: list[str], words: bool) -> tuple[list[int], list[int]]:
    """Each text's signature mask and length (words or characters): the passes over response
    text, run in a thread so a long response never holds the event loop."""
    return batch_signatures(texts), [len(t.split()) if words else len(t) for t in texts]


def _log_alarm(d: Decision) -> None:
    log.warning(
        "audit alarm %s (%s) at versions %d-%d: %s",
        d.alarm,
        d.subject,
        d.versions[0],
        d.versions[1],
        ", ".join(f"{k}={v}" for k, v in d.evidence.items() if v is not None),
    )


def clean(value: Any) -> Any:
    """The snapshot as strict JSON: a non-finite float (an undefined statistic) becomes null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value
