"""The gateway: a `ScoringBackend` that forwards items to supervised worker processes.

The serve app cannot tell it from the in-process backend, except in how it fails: when a
worker dies, every item it was scoring comes back as a `worker_lost` item error (never a
score), requests for its scorers get `not_ready` until the supervisor has restarted it,
and scorers on other workers are untouched.

Shutdown is ordered so nothing in flight is cut off and MPS is never quit under a client:
stop admission → drain in-flight requests (bounded) → stop workers → MPS: wait for an
empty client list (bounded) → quit → remove the private directories.

Batching happens in the workers, so each answer relays the request's queue/inference time
and the worker's finished batches; the gateway records them exactly as the in-process batcher
does (`record_timing`, `ServeMetrics.observe_batch`), so headers and `/metrics` match.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import shutil
import tempfile
import time
from typing import Any

from rewardplane.deploy.config import DeployConfig
from rewardplane.deploy.mps import ManagedMps
from rewardplane.deploy.supervisor import Supervisor, SupervisorSettings
from rewardplane.deploy.transport import RemoteError, WorkerLost, decode_results, encode_items
from rewardplane.serve.lifecycle import merge_ready, select_names
from rewardplane.serve.metrics import TOKEN_KINDS, BatchStats, ServeMetrics
from rewardplane.serve.protocol import STATUS_BY_CODE, ItemError, ScoreItem, ScorerInfo, ServeError
from rewardplane.serve.timing import record_timing

log = logging.getLogger(__name__)


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def decode_timing(raw: Any) -> tuple[float, float]:
    """(queue_s, inference_s) a worker measured; anything malformed reads as 0, never an error."""
    raw = raw if isinstance(raw, dict) else {}
    return _seconds(raw.get("queue_s")) or 0.0, _seconds(raw.get("inference_s")) or 0.0


def _batch_stats(entry: Any, scorers: set[str]) -> BatchStats | None:
    if not isinstance(entry, dict):
        return None
    scorer, delays, outcomes = entry.get("scorer"), entry.get("queue_delays"), entry.get("outcomes")
    inference_s = _seconds(entry.get("inference_s"))
    if (
        not isinstance(scorer, str)
        or scorer not in scorers
        or inference_s is None
        or not isinstance(delays, list | tuple)  # JSON from a worker, tuples from a Ray replica
        or not isinstance(outcomes, list | tuple)
        or not 0 < len(delays) == len(outcomes)
        or any(_seconds(d) is None for d in delays)
        or not all(isinstance(o, str) for o in outcomes)
    ):
        return None
    raw_tokens = entry.get("tokens") or {}
    tokens = (
        {k: v for k, v in raw_tokens.items() if k in TOKEN_KINDS and type(v) is int and v >= 0}
        if isinstance(raw_tokens, dict)
        else {}
    )
    return BatchStats(scorer, inference_s, tuple(float(d) for d in delays), tuple(outcomes), tokens)


def decode_batches(raw: Any, scorers: set[str]) -> list[BatchStats]:
    """Relayed batches of this worker's own scorers. A malformed one is dropped and logged:
    metrics must never fail a request, and a worker must not invent metric labels."""
    out: list[BatchStats] = []
    for entry in raw if isinstance(raw, list) else []:
        stats = _batch_stats(entry, scorers)
        if stats is None:
            log.warning("dropping malformed batch stats from a worker: %.200r", entry)
        else:
            out.append(stats)
    return out


class GatewayBackend:
    """Supervised workers (plus a managed MPS daemon in `mps` mode) behind the ScoringBackend API."""

    def __init__(
        self,
        config: DeployConfig,
        *,
        settings: SupervisorSettings | None = None,
        drain_timeout_s: float = 30.0,
        mps_client_timeout_s: float = 15.0,
    ) -> None:
        self.config = config
        self.settings = settings or SupervisorSettings()
        self.drain_timeout_s = drain_timeout_s
        self.mps: ManagedMps | None = None
        if config.mode in ("mps", "mps_external"):
            self.mps = ManagedMps(
                pipe_dir=config.mps.pipe_dir,
                log_dir=config.mps.log_dir,
                external=config.mode == "mps_external",
                client_timeout=mps_client_timeout_s,
            )
        self.run_dir = tempfile.mkdtemp(prefix="rkdeploy-", dir="/tmp")  # short: sun_path is 108 bytes
        service_extra = {k: v for k, v in config.service.items() if k == "limits"}
        self.request_timeout_s = config.request_timeout_s
        self.supervisor = Supervisor(
            config.worker_plans(),
            run_dir=self.run_dir,
            service_extra=service_extra,
            imports=config.imports,
            settings=self.settings,
        )
        self.metrics: ServeMetrics | None = None  # the app's, via attach_metrics
        self._admitting = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._started_at: float | None = None
        self._outstanding = {s.name: 0 for s in config.scorers}

    def attach_metrics(self, metrics: ServeMetrics) -> None:
        """Use the app's metrics. `rewardplane_queue_depth` is read live at every scrape: the items
        forwarded to a scorer's worker and not yet answered (queued there, or in its running
        batch). The queue itself lives in the worker, so this is the gateway's exact view of it."""
        self.metrics = metrics
        for name in self._outstanding:
            metrics.queue_depth.labels(name).set_function(lambda name=name: self._outstanding[name])

    def queue_depths(self) -> dict[str, int]:
        return dict(self._outstanding)

    async def start(self) -> None:
        if self.mps is not None:
            await asyncio.to_thread(self.mps.start)
            self.supervisor.extra_env = self.mps.env()
        self._started_at = time.time()
        self._admitting = True
        await self.supervisor.start()

    async def stop(self) -> None:
        self._admitting = False
        if self._in_flight:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._idle.wait(), self.drain_timeout_s)
        await self.supervisor.stop()
        if self.mps is not None:
            await asyncio.to_thread(self.mps.shutdown)
        shutil.rmtree(self.run_dir, ignore_errors=True)

    async def score(self, scorer: str, items: list[ScoreItem]) -> list[float | ItemError]:
        if not self._admitting:
            raise ServeError("not_ready", "the service is shutting down", retry_after=5)
        worker = self.supervisor.worker_for(scorer)
        if worker is None:
            raise ServeError("unknown_scorer", f"unknown scorer {scorer!r}")
        client = worker.client
        if not worker.ready or client is None:
            raise ServeError(
                "not_ready", f"scorer {scorer!r}: worker {worker.plan.name} is {worker.state}", retry_after=2
            )
        raw_items, body = encode_items(items)
        self._in_flight += 1
        self._outstanding[scorer] += len(items)
        self._idle.clear()
        try:
            header, _ = await client.call(
                "score", {"scorer": scorer, "items": raw_items}, body, timeout=self.request_timeout_s
            )
        except WorkerLost as exc:
            return [ItemError("worker_lost", f"worker {worker.plan.name}: {exc.message}")] * len(items)
        except RemoteError as exc:
            if exc.code in STATUS_BY_CODE:
                raise ServeError(exc.code, exc.message, retry_after=exc.retry_after) from None
            return [ItemError("scorer_failed", f"{exc.code}: {exc.message}")] * len(items)
        except TimeoutError:
            raise ServeError(
                "timeout", f"worker {worker.plan.name} did not answer in {self.request_timeout_s}s"
            ) from None
        finally:
            self._in_flight -= 1
            self._outstanding[scorer] -= len(items)
            if self._in_flight == 0:
                self._idle.set()
        queue_s, inference_s = decode_timing(header.get("timing"))
        record_timing(queue_s=queue_s, inference_s=inference_s)
        if self.metrics is not None:
            for stats in decode_batches(header.get("batches"), {s.name for s in worker.plan.scorers}):
                self.metrics.observe_batch(stats)
        return decode_results(header.get("results"), len(items))

    # --- lifecycle (docs/lifecycle.md): forwarded to the worker that hosts each scorer

    async def _worker_call(self, worker: Any, op: str, payload: dict[str, Any], timeout: float) -> dict:
        client = worker.client
        if not worker.ready or client is None:
            raise ServeError("not_ready", f"worker {worker.plan.name} is {worker.state}", retry_after=2)
        try:
            header, _ = await client.call(op, payload, timeout=timeout)
        except WorkerLost as exc:
            raise ServeError(
                "not_ready", f"worker {worker.plan.name}: {exc.message}", retry_after=2
            ) from None
        except RemoteError as exc:
            if exc.code in STATUS_BY_CODE:
                raise ServeError(exc.code, exc.message, retry_after=exc.retry_after) from None
            raise ServeError("internal", f"worker {worker.plan.name}: {exc.code}: {exc.message}") from None
        except TimeoutError:
            raise ServeError("timeout", f"worker {worker.plan.name} did not answer in {timeout:g}s") from None
        return header

    async def lifecycle_action(self, action: str, names: list[str] | None, timeout_s: float | None) -> dict:
        """`POST /v1/lifecycle/<action>`: each worker moves its own scorers; results by scorer."""
        by_worker: dict[str, tuple[Any, list[str]]] = {}
        for name in select_names(names, self.scorer_names()):
            worker = self.supervisor.worker_for(name)
            by_worker.setdefault(worker.plan.name, (worker, []))[1].append(name)
        budget = (30.0 if timeout_s is None else timeout_s) + self.request_timeout_s  # drain + the move
        payload = {"action": action, "timeout_s": timeout_s}
        outs = await asyncio.gather(
            *(
                self._worker_call(w, "lifecycle", {**payload, "scorers": s}, budget)
                for w, s in by_worker.values()
            ),
            return_exceptions=True,
        )
        results: dict[str, Any] = {}
        for (worker, _), out in zip(by_worker.values(), outs, strict=True):
            if isinstance(out, BaseException):
                raise out
            answered = out.get("results") or {}
            worker.note_lifecycle({n: r.get("state") for n, r in answered.items() if isinstance(r, dict)})
            results.update(answered)
        return results

    async def lifecycle_state(self) -> dict[str, Any]:
        """`GET /v1/lifecycle`: every ready worker's scorers, and each worker process's GPU memory."""
        scorers: dict[str, Any] = {}
        processes: dict[str, Any] = {}
        for w in self.supervisor.workers.values():
            if not w.ready or w.client is None:
                processes[w.plan.name] = {"worker_state": w.state}
                continue
            header = await self._worker_call(w, "lifecycle_state", {}, self.settings.health_timeout_s)
            answered = header.get("scorers") or {}
            w.note_lifecycle({n: s.get("state") for n, s in answered.items() if isinstance(s, dict)})
            scorers.update(answered)
            for memory in (header.get("processes") or {}).values():
                processes[w.plan.name] = memory
        return {"scorers": scorers, "processes": processes}

    def scorer_infos(self) -> dict[str, ScorerInfo]:
        out = {}
        for w in self.supervisor.workers.values():
            if not w.ready:
                continue
            for name, info in w.infos.items():
                out[name] = ScorerInfo(**info)
        return out

    def scorer_names(self) -> list[str]:
        return [s.name for s in self.config.scorers]

    def ready(self) -> tuple[bool, dict[str, Any]]:
        """Per scorer: "ready", its worker's state, or (as in --config mode) the lifecycle state of
        a scorer parked on purpose (`offloaded`, `draining`, ...), which stays healthy. The states
        are the workers' own, as of the last heartbeat or lifecycle call through this gateway."""
        details: dict[str, Any] = {}
        states: dict[str, str] = {}
        for w in self.supervisor.workers.values():
            for s in w.plan.scorers:
                details[s.name] = "ready" if w.ready else f"worker {w.plan.name} {w.state}"
            if w.ready:
                states.update(w.lifecycle)
        ok, details = merge_ready(details, states)
        return self._admitting and ok, details

    def load_failure(self, scorer: str) -> str | None:
        """Why `scorer`'s worker failed to load (None unless it did): `rewardplane serve` exits 2 with it."""
        w = self.supervisor.worker_for(scorer)
        return w.detail if w is not None and w.state == "failed" else None

    def deployment(self) -> dict[str, Any]:
        """`GET /v1/deployment`: the layout and the live state of every process."""
        workers = [w.describe() for w in self.supervisor.workers.values()]
        mps: dict[str, Any] | None = None
        if self.mps is not None:
            mps = {
                "managed": not self.mps.external,
                "pipe_dir": self.mps.pipe_dir,
                "log_dir": self.mps.log_dir,
                "server_pids": self.mps.server_pids(),
            }
        return {
            "backend": "workers",
            "mode": self.config.mode,
            "gpus": list(self.config.gpus),
            "shared_fault_domain": self.config.shared_fault_domain,
            "workers": workers,
            "worker_gpu": {w["name"]: w["gpu"] for w in workers},
            "mps": mps,
            "restarts": sum(w["restarts"] for w in workers),
            "started_at": self._started_at,
        }
