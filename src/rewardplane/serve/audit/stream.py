"""The audit stream: a sample of the proxy's scored items, re-scored by the auditors off the
critical path (docs/audit.md).

`observe` is all the request path ever runs: for each item the proxy scored, a version look-up,
one random draw and, for a sampled item, a `put_nowait` on a bounded queue. It never awaits,
never raises into the request and never blocks: a full queue (by items or by bytes) drops the
item and counts it. Worker tasks drain the queue in batches, score each batch with every
auditor (a hosted scorer through the backend, or another service over HTTP), and hand the
results to the ledger in a thread (statistics are CPU work) — so neither a slow auditor nor
the statistics can delay or fail a proxy response; at worst audit items are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import random
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rewardplane import __version__
from rewardplane.core import atomic
from rewardplane.serve.audit.alarms import Decision
from rewardplane.serve.audit.config import AuditConfig, ExternalAuditor
from rewardplane.serve.audit.flat import flat_metrics
from rewardplane.serve.audit.ledger import NO_SOURCE, Audited, Ledger
from rewardplane.serve.audit.metrics import AuditMetrics
from rewardplane.serve.audit.signatures import SIGNATURES, signatures
from rewardplane.serve.scorers.base import ItemError, ScoreItem
from rewardplane.serve.scorers.common import as_text

log = logging.getLogger(__name__)

SCHEMA = "rewardplane.audit/1"
AUDIT_FILE = "audit.json"


@dataclass(frozen=True)
class _Job:
    item: ScoreItem
    version: int
    source: str
    proxy: float
    size: int


def _size(item: ScoreItem) -> int:
    text = as_text(item.prompt) if item.prompt else ""
    return len(text) + len(as_text(item.response) if item.response else "") + len(item.image or b"") + 256


class _Hosted:
    """An auditor this service hosts: scored through the backend, as a request would be."""

    def __init__(self, name: str, backend: Any) -> None:
        self.name = name
        self.backend = backend

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


class AuditStream:
    def __init__(self, config: AuditConfig, backend: Any, metrics: AuditMetrics | None = None) -> None:
        self.config = config
        self.backend = backend
        self.metrics = metrics
        self.ledger = Ledger(config)
        self.auditors = [_Hosted(a, backend) if isinstance(a, str) else _Remote(a) for a in config.auditors]
        self.counts: dict[str, int] = {}
        self.auditor_errors: dict[str, int] = {a.name: 0 for a in self.auditors}
        self._queue: asyncio.Queue[_Job] | None = None
        self._bytes = 0
        self._arrivals = 0
        self._rng = random.Random(f"rewardplane-audit-sample:{config.seed}")
        self._lock = threading.Lock()  # the ledger: recorded in worker threads, read by snapshots
        self._tasks: list[asyncio.Task] = []
        self._firing: set[tuple[str, str]] = set()
        self.flat: dict[str, float] = {}
        """The newest numbers as trainers log them (`flat.flat_metrics`), refreshed per batch."""

    # ------------------------------------------------------------------ the request path

    def observe(self, names: list[str], items: list[ScoreItem], results: dict[str, list[Any]]) -> None:
        """Offer the proxy's scored items to the audit. Never blocks, never raises."""
        try:
            if self.config.proxy in results and self._queue is not None:
                self._offer(items, results[self.config.proxy])
        except Exception:  # the audit must never fail a response
            log.exception("audit: observe failed; items not audited")

    def _offer(self, items: list[ScoreItem], values: list[Any]) -> None:
        queue = self._queue
        assert queue is not None
        cfg = self.config
        for item, value in zip(items, values, strict=False):
            if not isinstance(value, float) or not math.isfinite(value):
                continue
            meta = item.metadata or {}
            raw = meta.get(cfg.by)
            if raw is None:
                if cfg.arrival_window is None:
                    self._count("unversioned")
                    continue
                version = self._arrivals // cfg.arrival_window
                self._arrivals += 1
            else:
                version = _as_version(raw)
                if version is None:
                    self._count("bad_version")
                    continue
            if not self._sampled(item):
                continue
            self._count("sampled")
            job = _Job(
                item, version, str(meta.get(cfg.source_key) or NO_SOURCE)[:128], float(value), _size(item)
            )
            if self._bytes + job.size > cfg.queue_bytes:
                self._count("dropped_queue_bytes")
                continue
            try:
                queue.put_nowait(job)
            except asyncio.QueueFull:
                self._count("dropped_queue_full")
                continue
            self._bytes += job.size
        if self.metrics is not None:
            self.metrics.queue_depth.set(queue.qsize())

    def _sampled(self, item: ScoreItem) -> bool:
        """A GRPO group is sampled whole (a hash of its id), so its items can be compared;
        other items by an independent draw each."""
        if item.group_id is not None:
            digest = hashlib.blake2b(f"{self.config.seed}:{item.group_id}".encode(), digest_size=8).digest()
            return int.from_bytes(digest, "big") < self.config.sample * 2**64
        return self._rng.random() < self.config.sample

    def _count(self, outcome: str, n: int = 1) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + n
        if self.metrics is not None:
            self.metrics.items.labels(outcome).inc(n)

    # ------------------------------------------------------------------ the workers

    async def start(self) -> None:
        self._queue = asyncio.Queue(maxsize=self.config.queue)
        self._tasks = [
            asyncio.create_task(self._work(), name=f"audit-worker-{i}")
            for i in range(self.config.concurrency)
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        self._tasks = []
        for auditor in self.auditors:
            with contextlib.suppress(Exception):
                await auditor.close()

    async def _work(self) -> None:
        queue = self._queue
        assert queue is not None
        loop = asyncio.get_running_loop()
        while True:
            batch = [await queue.get()]
            # fill the batch for up to batch_wait_s: an auditor's forward of 2 items costs
            # nearly what one of 32 does, and audit items are not waited for by anyone
            deadline = loop.time() + self.config.batch_wait_s
            while len(batch) < self.config.batch_size:
                if not queue.empty():
                    batch.append(queue.get_nowait())
                    continue
                left = deadline - loop.time()
                if left <= 0:
                    break
                await asyncio.sleep(min(left, 0.02))
            self._bytes -= sum(job.size for job in batch)
            if self.metrics is not None:
                self.metrics.queue_depth.set(queue.qsize())
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
        """Wait until every queued item has been audited and recorded (tests, benchmarks)."""
        if self._queue is not None:
            await self._queue.join()

    async def _audit(self, batch: list[_Job]) -> None:
        items = [job.item for job in batch]
        scored = await asyncio.gather(*(self._score(a, items) for a in self.auditors))
        audited: list[Audited] = []
        failed = 0
        texts = [as_text(job.item.response) if job.item.response else "" for job in batch]
        # the signatures read policy text: linear, but off the event loop (health checks wait on it)
        masks = await asyncio.to_thread(lambda: [signatures(text) for text in texts])
        for i, job in enumerate(batch):
            values = {a.name: scored[k][i] for k, a in enumerate(self.auditors)}
            if all(math.isnan(v) for v in values.values()):
                failed += 1
                continue
            text = texts[i]
            length = len(text.split()) if self.config.length_unit == "words" else len(text)
            truncated = (job.item.metadata or {}).get("truncated")
            cap = self.config.length_cap
            at_cap = truncated if isinstance(truncated, bool) else (cap is not None and length >= cap)
            audited.append(Audited(job.version, job.source, job.proxy, values, length, at_cap, masks[i]))
        if failed:
            self._count("auditor_failed", failed)
        if audited:
            self._count("audited", len(audited))
            await asyncio.to_thread(self._record, audited)

    async def _score(self, auditor: Any, items: list[ScoreItem]) -> list[float]:
        """One value per item, NaN where the auditor failed (counted per auditor)."""
        try:
            results = await asyncio.wait_for(auditor.score(items), self.config.timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("audit: auditor %s failed a batch of %d: %s", auditor.name, len(items), exc)
            results = [None] * len(items)
        out = []
        for r in results if len(results) == len(items) else [None] * len(items):
            ok = isinstance(r, float) and not isinstance(r, ItemError) and math.isfinite(r)
            out.append(float(r) if ok else math.nan)
        errors = sum(math.isnan(v) for v in out)
        if errors:
            self.auditor_errors[auditor.name] += errors
            if self.metrics is not None:
                self.metrics.auditor_errors.labels(auditor.name).inc(errors)
        return out

    def _record(self, audited: list[Audited]) -> None:
        with self._lock:
            late, bins = self.ledger.late, len(self.ledger.bins)
            self.ledger.record(audited)
            if self.ledger.late > late:
                self._count("late", self.ledger.late - late)
            for decision in self.ledger.settle():
                key = (decision.alarm, decision.subject)
                if decision.fired and key not in self._firing:
                    _log_alarm(decision)  # once as it starts firing, not at every bin it fires
                (self._firing.add if decision.fired else self._firing.discard)(key)
            closed = self.ledger.bins[bins:]
            if self.metrics is not None:
                for summary in closed:
                    self.metrics.observe_bin(summary)
            self.flat = flat_metrics(clean(self._snapshot(summary=True, since=None)))
            if closed and self.config.out:
                self._write(Path(self.config.out))

    def _write(self, out: Path) -> None:
        try:
            body = clean(self._snapshot(summary=False, since=None))
            atomic.write_text(out / AUDIT_FILE, json.dumps(body, allow_nan=False, indent=1) + "\n")
        except OSError as exc:
            log.warning("audit: could not write %s: %s", out / AUDIT_FILE, exc)

    # ------------------------------------------------------------------ reading

    async def snapshot(self, *, summary: bool = False, since: int | None = None) -> dict[str, Any]:
        """`GET /v1/audit`: counters, alarms, closed bins and versions (docs/audit.md)."""
        return await asyncio.to_thread(self._locked_snapshot, summary, since)

    def _locked_snapshot(self, summary: bool, since: int | None) -> dict[str, Any]:
        with self._lock:
            return clean(self._snapshot(summary=summary, since=since))

    def _snapshot(self, *, summary: bool, since: int | None) -> dict[str, Any]:
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
            "newest_version": ledger.newest if ledger.newest >= 0 else None,
            "binned_through": ledger.binned_through if ledger.binned_through >= 0 else None,
            "alarms": ledger.alarms,
        }
        bins = ledger.bins if not summary else ledger.bins[-1:]
        if since is not None:
            bins = [b for b in bins if b["versions"][1] >= since]
        body["bins"] = bins
        if not summary:
            body["versions"] = ledger.snapshot_versions(since)
        return body


def _as_version(raw: Any) -> int | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw if raw >= 0 else None
    if isinstance(raw, float) and raw.is_integer() and raw >= 0:
        return int(raw)
    if isinstance(raw, str) and raw.strip().isdigit():
        return int(raw.strip())
    return None


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
