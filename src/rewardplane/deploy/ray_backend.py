"""`rewardplane serve --deploy deploy.yaml --backend ray`: each scorer a Ray Serve deployment.

For when one machine is not enough. The HTTP app is unchanged (it runs in the driver); each
scorer becomes a Ray Serve deployment with `num_replicas` replicas, fractional `num_gpus`
(Ray sets CUDA_VISIBLE_DEVICES per replica) and `@serve.batch` dynamic batching inside each
replica. Failure semantics match the worker gateway: a replica that dies mid-batch turns its
in-flight items into `worker_lost` errors; Ray Serve restarts it, and readiness is false
until the deployment is healthy again.

MPS: Ray cannot start a daemon on remote nodes, so the env is injected through the
deployment's `runtime_env`: `mode: mps` starts a managed daemon on this (single) node;
`mode: mps_external` points replicas at a daemon each node already runs at the same pipe
directory. A CUDA client whose node has no daemon there simply runs without MPS.

Items travel to replicas as plain dicts and bytes built by this process from validated
requests (Ray serialises them internally); replicas never receive anything a client sent
without the HTTP layer's validation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rewardplane.deploy.config import MPS_MODES, DeployConfig, ScorerPlacement
from rewardplane.deploy.gateway import decode_batches, decode_timing
from rewardplane.deploy.mps import ManagedMps
from rewardplane.deploy.ray_lifecycle import RayLifecycle, error_of, raise_error, replica_lost
from rewardplane.deploy.transport import decode_items, decode_results, encode_items, encode_results
from rewardplane.serve.admission import admitted
from rewardplane.serve.lifecycle import (
    Lifecycle,
    describe_process,
    merge_ready,
    run_action,
    scorer_lifecycle,
    warm_up,
)
from rewardplane.serve.metrics import BatchStats, ServeMetrics, outcome
from rewardplane.serve.protocol import ItemError, ScoreItem, ScorerInfo, ServeError
from rewardplane.serve.timing import record_timing

log = logging.getLogger(__name__)

APP_PREFIX = "rewardplane-"
LIFECYCLE_POLL_EVERY = 5
"""Re-read the replicas' lifecycle states every this many status polls (5 s by default)."""


class ScorerReplica:
    """One Ray Serve replica hosting one scorer. Wrapped by `serve.deployment` at start.

    Like a `--config` process it carries the scorer's lifecycle state machine
    (`rewardplane.serve.lifecycle`): every score call is admitted through it (503 `offloaded` /
    `draining`, or an `auto_onload`), and `lifecycle_action` / `lifecycle_state` are what the
    driver broadcasts to every replica (`rewardplane.deploy.ray_lifecycle`). Batches and weight
    moves run on one thread, so a move never overlaps a forward. Whole-request errors come
    back as data (`error_of`): Ray would wrap a raised `ServeError` in its own exception type.
    """

    async def __init__(self, spec: dict[str, Any], imports: list[str]) -> None:
        for module in imports:
            importlib.import_module(module)
        from rewardplane.serve.batcher import check_value
        from rewardplane.serve.config import config_from_dict
        from rewardplane.serve.scorers.registry import build_scorer

        (self.spec,) = config_from_dict({"scorers": [spec]}).scorers
        self.scorer = build_scorer(self.spec)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"scorer-{self.spec.name}")
        await self._run(self.scorer.load)
        try:
            await warm_up(self.scorer, self._run)
        except RuntimeError as exc:
            raise RuntimeError(f"scorer {self.spec.name}: {exc}") from None
        self._check_value = check_value
        self._unsent: list[dict[str, Any]] = []  # finished batches, relayed with the next answer
        self.score_item.set_max_batch_size(self.spec.max_batch_size)
        self.score_item.set_batch_wait_timeout_s(self.spec.max_wait_ms / 1000)
        self.lifecycle = Lifecycle()
        self.lifecycle.add(scorer_lifecycle(self.scorer, self._run, self.spec))
        from ray import serve

        self.replica = serve.get_replica_context().replica_id.unique_id
        await self.lifecycle.scorers[self.spec.name].started()  # on_demand: offloaded now

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def info(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self.scorer.info()), "pid": os.getpid()}

    async def score(self, raw_items: list[dict[str, Any]], body: bytes) -> dict[str, Any]:
        """Results plus the timing and batch stats the worker transport carries (gateway.py reads
        both the same way), so x-queue-time / x-inference-time and /metrics work under Ray too."""
        items = decode_items(raw_items, body)
        try:
            async with self.lifecycle.admit(self.spec.name):  # 503 offloaded/draining, or an onload
                arrived = time.perf_counter()
                answers = await asyncio.gather(*(self.score_item((item, arrived)) for item in items))
        except ServeError as err:
            return {"pid": os.getpid(), "error": error_of(err)}
        batches, self._unsent = self._unsent, []
        return {
            "pid": os.getpid(),
            "results": encode_results([value for value, _, _ in answers]),
            "timing": {
                "queue_s": max((queued for _, queued, _ in answers), default=0.0),
                "inference_s": max((took for _, _, took in answers), default=0.0),
            },
            "batches": batches,
        }

    async def score_item(self, entries: list[tuple[ScoreItem, float]]) -> list[tuple[Any, float, float]]:
        """One batch (`@serve.batch` below gathers it): (value, queue_s, inference_s) per item."""
        items = [item for item, _ in entries]
        started = time.perf_counter()
        try:
            # the admission contract first (serve/admission.py), as the in-process batcher applies it
            values = await self._run(admitted, self.scorer, items, self.scorer.score_batch)
            if len(values) != len(items):
                values = [ItemError("scorer_failed", f"scorer returned {len(values)} values")] * len(items)
            else:
                values = [self._check_value(v) for v in values]
        except Exception as exc:
            values = [ItemError("scorer_failed", f"{type(exc).__name__}: {exc}"[:500])] * len(items)
        took = time.perf_counter() - started
        delays = [started - arrived for _, arrived in entries]
        self._unsent.append(
            dataclasses.asdict(BatchStats(self.spec.name, took, tuple(delays), tuple(map(outcome, values))))
        )
        return [(value, delay, took) for value, delay in zip(values, delays, strict=True)]

    async def lifecycle_action(self, action: str, timeout_s: float | None) -> dict[str, Any]:
        """This replica's part of `POST /v1/lifecycle/<action>`: its result, or its error."""
        answer: dict[str, Any] = {"replica": self.replica, "pid": os.getpid()}
        try:
            results = await run_action(self.lifecycle, action, None, timeout_s)
        except ServeError as err:
            return {**answer, "state": self.lifecycle.states()[self.spec.name], "error": error_of(err)}
        return {**answer, "result": results[self.spec.name]}

    async def lifecycle_state(self) -> dict[str, Any]:
        """This replica's part of `GET /v1/lifecycle`: its state machine and its GPU memory."""
        out = await describe_process(self.lifecycle, self.replica)
        return {
            "replica": self.replica,
            "pid": os.getpid(),
            "scorer": out["scorers"][self.spec.name],
            "memory": out["processes"][self.replica],
        }


def _batched_replica_class() -> type:
    """Apply `@serve.batch` lazily so importing this module does not import Ray."""
    from ray import serve

    class BatchedScorerReplica(ScorerReplica):
        score_item = serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)(ScorerReplica.score_item)

    return BatchedScorerReplica


class RayBackend:
    """A ScoringBackend whose scorers are Ray Serve deployments (local or multi-node cluster)."""

    def __init__(self, config: DeployConfig, *, health_poll_s: float = 1.0) -> None:
        self.config = config
        self.health_poll_s = health_poll_s
        self.mps: ManagedMps | None = None
        if config.mode in MPS_MODES:
            self.mps = ManagedMps(
                pipe_dir=config.mps.pipe_dir,
                log_dir=config.mps.log_dir,
                external=config.mode == "mps_external",
            )
        self._handles: dict[str, Any] = {}
        self._infos: dict[str, ScorerInfo] = {}
        self._status: dict[str, str] = {s.name: "pending" for s in config.scorers}
        self._pids: dict[str, set[int]] = {s.name: set() for s in config.scorers}
        self.lifecycle = RayLifecycle(
            self._handles, [s.name for s in config.scorers], request_timeout_s=config.request_timeout_s
        )
        self._owns_ray = False
        self._admitting = False
        self._poller: asyncio.Task[None] | None = None
        self.metrics: ServeMetrics | None = None  # the app's, via attach_metrics

    def attach_metrics(self, metrics: ServeMetrics) -> None:
        self.metrics = metrics

    def _actor_options(self, p: ScorerPlacement) -> dict[str, Any]:
        env: dict[str, str] = {}
        if self.mps is not None:
            env.update(self.mps.env())
            if p.mps_active_thread_percentage is not None:
                env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(p.mps_active_thread_percentage)
            if p.mps_pinned_mem_limit is not None:
                env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = p.mps_pinned_mem_limit
        num_gpus = p.num_gpus if p.num_gpus is not None else (1.0 if p.gpu is not None else 0.0)
        options: dict[str, Any] = {
            "num_gpus": num_gpus,
            "num_cpus": float(self.config.ray.get("num_cpus", 0.5)),
        }
        if env:
            options["runtime_env"] = {"env_vars": env}
        return options

    def _init_ray(self) -> None:
        """Connect to (or start) Ray. Runs on the main thread: ray.init installs signal handlers."""
        import ray

        if not ray.is_initialized():
            ray.init(
                address=self.config.ray.get("address"),
                namespace=self.config.ray.get("namespace", "rewardplane"),
                _temp_dir=self.config.ray.get("temp_dir"),
                include_dashboard=False,
                log_to_driver=bool(self.config.ray.get("log_to_driver", True)),
            )
            self._owns_ray = True

    def _start_sync(self) -> None:
        from ray import serve

        if self.mps is not None:
            self.mps.start()
        serve.start(proxy_location="Disabled")
        replica_cls = _batched_replica_class()
        for p in self.config.scorers:
            self._status[p.name] = "deploying"
            deployment = serve.deployment(
                replica_cls,
                name=p.name,
                num_replicas=p.num_replicas,
                ray_actor_options=self._actor_options(p),
                max_ongoing_requests=int(self.config.ray.get("max_ongoing_requests", 256)),
                health_check_period_s=float(self.config.ray.get("health_check_period_s", 2.0)),
                max_constructor_retry_count=int(self.config.ray.get("max_constructor_retry_count", 3)),
            )
            try:
                handle = serve.run(
                    deployment.bind(p.spec, list(self.config.imports)),
                    name=APP_PREFIX + p.name,
                    route_prefix=None,
                )
                info = handle.info.remote().result()
            except Exception as exc:
                log.exception("Ray deployment of %s failed", p.name)
                self._status[p.name] = f"failed: {type(exc).__name__}: {exc}"[:300]
                continue
            self._pids[p.name].add(int(info.pop("pid")))
            self._infos[p.name] = ScorerInfo(**info)
            self._handles[p.name] = handle
            self._status[p.name] = "ready"

    async def start(self) -> None:
        self._admitting = True
        self._init_ray()
        await asyncio.to_thread(self._start_sync)
        self._poller = asyncio.get_running_loop().create_task(self._poll_status())

    def _refresh_status(self) -> None:
        from ray import serve

        apps = serve.status().applications
        for name in self._handles:
            app = apps.get(APP_PREFIX + name)
            dep = app.deployments.get(name) if app is not None else None
            if dep is None:
                self._status[name] = "missing"
                continue
            self._status[name] = (
                "ready" if str(dep.status.value) == "HEALTHY" else str(dep.status.value).lower()
            )

    async def _poll_status(self) -> None:
        polls = 0
        while True:
            try:
                await asyncio.to_thread(self._refresh_status)
            except Exception as exc:
                log.warning("Ray Serve status poll failed: %s", exc)
            # the replicas' own moves (per_call idle offload, auto_onload, a restarted replica)
            # reach /health/ready; every LIFECYCLE_POLL_EVERY polls, since each is a request
            # (and an access-log line) per replica
            if polls % LIFECYCLE_POLL_EVERY == 0:
                try:
                    await self.lifecycle.state(timeout_s=max(5.0, LIFECYCLE_POLL_EVERY * self.health_poll_s))
                except Exception as exc:
                    log.debug("lifecycle poll failed: %s", exc)
            polls += 1
            await asyncio.sleep(self.health_poll_s)

    async def score(self, scorer: str, items: list[ScoreItem]) -> list[float | ItemError]:
        if not self._admitting:
            raise ServeError("not_ready", "the service is shutting down", retry_after=5)
        handle = self._handles.get(scorer)
        if handle is None:
            if scorer not in self._status:
                raise ServeError("unknown_scorer", f"unknown scorer {scorer!r}")
            raise ServeError("not_ready", f"scorer {scorer!r} is {self._status[scorer]}", retry_after=5)
        raw, body = encode_items(items)
        try:
            out = await handle.score.remote(raw, body)
        except Exception as exc:
            if replica_lost(exc):
                self._status[scorer] = "restarting"
                return [
                    ItemError("worker_lost", f"Ray replica of {scorer} died: {type(exc).__name__}")
                ] * len(items)
            from ray.serve.exceptions import BackPressureError

            if isinstance(exc, BackPressureError):
                raise ServeError("queue_full", str(exc), retry_after=1) from None
            raise
        self._pids[scorer].add(int(out["pid"]))
        if "error" in out:  # the replica's lifecycle refused it (offloaded, draining, onload_failed)
            raise_error(out["error"])
        queue_s, inference_s = decode_timing(out.get("timing"))
        record_timing(queue_s=queue_s, inference_s=inference_s)
        if self.metrics is not None:
            for stats in decode_batches(out.get("batches"), {scorer}):
                self.metrics.observe_batch(stats)
        return decode_results(out.get("results"), len(items))

    def scorer_infos(self) -> dict[str, ScorerInfo]:
        return {n: i for n, i in self._infos.items() if self._status.get(n) == "ready"}

    def scorer_names(self) -> list[str]:
        return list(self._status)

    async def lifecycle_action(self, action: str, names: list[str] | None, timeout_s: float | None) -> dict:
        """`POST /v1/lifecycle/<action>` on every replica of each scorer (docs/lifecycle.md)."""
        return await self.lifecycle.action(action, names, timeout_s)

    async def lifecycle_state(self) -> dict[str, Any]:
        """`GET /v1/lifecycle`: each scorer merged over its replicas, each replica's GPU memory."""
        return await self.lifecycle.state()

    def ready(self) -> tuple[bool, dict[str, Any]]:
        """As in --config mode: a scorer whose replicas are all parked on purpose (offloaded,
        draining, ...) is healthy and says its state; as of the last action or poll."""
        ok, details = merge_ready(dict(self._status), self.lifecycle.states)
        return self._admitting and ok, details

    def deployment(self) -> dict[str, Any]:
        scorers = []
        for p in self.config.scorers:
            opts = self._actor_options(p)
            scorers.append(
                {
                    "name": p.name,
                    "state": self._status[p.name],
                    "num_replicas": p.num_replicas,
                    "num_gpus": opts["num_gpus"],
                    "env": (opts.get("runtime_env") or {}).get("env_vars", {}),
                    "replica_pids_seen": sorted(self._pids[p.name]),
                }
            )
        restarts = sum(max(0, len(self._pids[p.name]) - p.num_replicas) for p in self.config.scorers)
        return {
            "backend": "ray",
            "mode": self.config.mode,
            "shared_fault_domain": self.config.shared_fault_domain,
            "scorers": scorers,
            "mps": None
            if self.mps is None
            else {
                "managed": not self.mps.external,
                "pipe_dir": self.mps.pipe_dir,
                "server_pids": self.mps.server_pids(),
            },
            "restarts": restarts,
            "restarts_note": "replica processes seen beyond num_replicas (Ray Serve restarts replicas itself)",
            "time": time.time(),
        }

    def _stop_sync(self) -> None:
        import ray
        from ray import serve

        for name in list(self._handles):
            try:
                serve.delete(APP_PREFIX + name)
            except Exception as exc:
                log.warning("serve.delete(%s) failed: %s", name, exc)
        self._handles.clear()
        if self._owns_ray:
            serve.shutdown()
            ray.shutdown()
        if self.mps is not None:
            self.mps.shutdown()

    async def stop(self) -> None:
        self._admitting = False
        if self._poller is not None:
            self._poller.cancel()
        await asyncio.to_thread(self._stop_sync)
