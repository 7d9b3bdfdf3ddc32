"""Start, watch and restart scorer worker processes.

Each worker gets a task that owns its whole life: spawn → wait for the socket (the worker
binds it only after warm-up) → health-check every few seconds → on exit or repeated failed
checks, mark it not ready, wait with exponential backoff, respawn. A worker that never
became ready is marked `failed` and not restarted: load errors (a bad path, a missing
weight) are deterministic, and a restart loop would only hide them. Once a worker has been
ready, every later crash is restarted, because that is what a long-running service needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from rewardplane.deploy.config import WorkerPlan
from rewardplane.deploy.transport import TransportClient

log = logging.getLogger(__name__)


def _load_failure(socket_path: str) -> str:
    """The causes a worker wrote before exiting with a load failure ("" if it wrote none)."""
    from rewardplane.deploy.worker import failure_path

    try:
        with open(failure_path(socket_path), encoding="utf-8") as f:
            causes = json.load(f)
    except (OSError, ValueError):
        return ""
    if not isinstance(causes, dict):
        return ""
    return "; ".join(f"{name}: {str(status).removeprefix('failed: ')}" for name, status in causes.items())[
        :1000
    ]


@dataclass
class SupervisorSettings:
    startup_timeout_s: float = 900.0
    health_interval_s: float = 1.0
    """The heartbeat: a `health` call this often to every ready worker."""
    lost_after_s: float = 5.0
    """No heartbeat answered for this long: the worker is lost (stopped, hung, partitioned). Its
    in-flight items fail at once with `worker_lost`, it is killed and restarted. A worker whose
    event loop is alive answers within milliseconds even while its scorer is busy in a thread."""
    health_timeout_s: float = 10.0
    unhealthy_checks: int = 3
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    backoff_reset_s: float = 60.0
    stop_timeout_s: float = 10.0


@dataclass
class WorkerHandle:
    """Live state of one worker, as `/v1/deployment` reports it."""

    plan: WorkerPlan
    socket_path: str
    plan_path: str
    state: str = "pending"  # pending|starting|ready|unhealthy|lost|restarting|failed|stopped
    pid: int | None = None
    restarts: int = 0
    last_exit_code: int | None = None
    detail: str = ""
    client: TransportClient | None = None
    infos: dict[str, dict[str, Any]] = field(default_factory=dict)
    lifecycle: dict[str, str] = field(default_factory=dict)
    """Its scorers' lifecycle states (resident, offloaded, ...) as of the last answer that said them."""
    proc: asyncio.subprocess.Process | None = None
    ready_event: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def ready(self) -> bool:
        return self.state == "ready" and self.client is not None and not self.client.closed

    def note_lifecycle(self, states: Any) -> None:
        """Keep the states a worker reported for its own scorers (anything else is ignored)."""
        if isinstance(states, dict):
            mine = {s.name for s in self.plan.scorers}
            self.lifecycle.update({n: v for n, v in states.items() if n in mine and isinstance(v, str)})

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.plan.name,
            "scorers": [s.name for s in self.plan.scorers],
            "gpu": self.plan.gpu,
            "env": {k: v for k, v in self.plan.env.items() if k.startswith("CUDA_")},
            "memory_fraction": self.plan.memory_fraction,
            "pid": self.pid,
            "state": self.state,
            "restarts": self.restarts,
            "last_exit_code": self.last_exit_code,
            "detail": self.detail,
        }


class Supervisor:
    def __init__(
        self,
        plans: list[WorkerPlan],
        *,
        run_dir: str,
        service_extra: dict[str, Any],
        imports: tuple[str, ...] = (),
        extra_env: dict[str, str] | None = None,
        settings: SupervisorSettings | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.settings = settings or SupervisorSettings()
        self.imports = imports
        self.service_extra = service_extra
        self.extra_env = extra_env or {}
        self.workers: dict[str, WorkerHandle] = {}
        for i, plan in enumerate(plans):
            self.workers[plan.name] = WorkerHandle(
                plan=plan,
                socket_path=os.path.join(run_dir, f"w{i}.sock"),
                plan_path=os.path.join(run_dir, f"w{i}.json"),
            )
        self._by_scorer = {s.name: w for w in self.workers.values() for s in w.plan.scorers}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    def worker_for(self, scorer: str) -> WorkerHandle | None:
        return self._by_scorer.get(scorer)

    async def start(self) -> None:
        """Spawn every worker and wait until each is ready or has failed to load."""
        for w in self.workers.values():
            self._write_plan(w)
            self._tasks.append(asyncio.get_running_loop().create_task(self._supervise(w)))
        await asyncio.gather(*(w.ready_event.wait() for w in self.workers.values()))

    def _write_plan(self, w: WorkerHandle) -> None:
        plan = {
            "name": w.plan.name,
            "service": {**self.service_extra, "scorers": [s.spec for s in w.plan.scorers]},
            "env": {**w.plan.env, **self.extra_env},
            "memory_fraction": w.plan.memory_fraction,
            "imports": list(self.imports),
        }
        fd = os.open(w.plan_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(plan, f)

    async def _spawn(self, w: WorkerHandle) -> asyncio.subprocess.Process:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(w.socket_path)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rewardplane.deploy.worker",
            "--plan",
            w.plan_path,
            "--socket",
            w.socket_path,
            stdin=asyncio.subprocess.PIPE,
            env=env,
            # Own session: a terminal Ctrl-C reaches only the gateway, which then drains and
            # stops the workers in order instead of racing them to exit.
            start_new_session=True,
        )
        w.proc, w.pid, w.state = proc, proc.pid, "starting"
        log.info("worker %s starting (pid %d)", w.plan.name, proc.pid)
        return proc

    async def _connect_when_ready(self, w: WorkerHandle, proc: asyncio.subprocess.Process) -> bool:
        deadline = time.monotonic() + self.settings.startup_timeout_s
        while proc.returncode is None and time.monotonic() < deadline:
            if os.path.exists(w.socket_path):
                try:
                    client = await TransportClient.connect(w.socket_path)
                except (ConnectionError, OSError):
                    await asyncio.sleep(0.05)
                    continue
                header, _ = await client.call("health", timeout=self.settings.health_timeout_s)
                w.infos = header.get("scorers", {})
                w.note_lifecycle(header.get("lifecycle"))
                w.client = client
                return bool(header.get("ready"))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(proc.wait()), 0.1)
        return False

    async def _supervise(self, w: WorkerHandle) -> None:
        failures = 0
        ever_ready = False
        while not self._stopping:
            proc = await self._spawn(w)
            try:
                ok = await self._connect_when_ready(w, proc)
            except Exception as exc:
                ok = False
                w.detail = f"readiness check failed: {exc}"
            if ok:
                w.state, w.detail = "ready", ""
                ready_since = time.monotonic()
                ever_ready = True
                w.ready_event.set()
                log.info("worker %s ready (pid %d)", w.plan.name, proc.pid)
                await self._watch(w, proc)
                if time.monotonic() - ready_since > self.settings.backoff_reset_s:
                    failures = 0
            else:
                await self._kill(proc)
            code = await proc.wait()
            w.last_exit_code = code
            if w.client is not None:
                await w.client.close()
                w.client = None
            if self._stopping:
                break
            if not ever_ready:
                w.state = "failed"
                w.detail = _load_failure(w.socket_path) or w.detail
                w.detail = w.detail or f"worker exited with code {code} before becoming ready"
                log.error("worker %s failed to start: %s", w.plan.name, w.detail)
                w.ready_event.set()
                return
            w.state = "restarting"
            delay = min(self.settings.backoff_max_s, self.settings.backoff_base_s * 2**failures)
            failures += 1
            log.warning(
                "worker %s exited (code %s); restart %d in %.1fs", w.plan.name, code, w.restarts + 1, delay
            )
            await asyncio.sleep(delay)
            w.restarts += 1
        w.state = "stopped"

    async def _watch(self, w: WorkerHandle, proc: asyncio.subprocess.Process) -> None:
        """Return when the worker exits, is lost (no heartbeat answered for `lost_after_s`) or
        is killed for failing health checks."""
        bad = 0
        last_answer = time.monotonic()
        exited = asyncio.ensure_future(proc.wait())
        try:
            while not exited.done():
                await asyncio.wait({exited}, timeout=self.settings.health_interval_s)
                if exited.done() or self._stopping:
                    return
                healthy = answered = False
                # wait no longer than the time left before the worker counts as lost
                left = self.settings.lost_after_s - (time.monotonic() - last_answer)
                try:
                    assert w.client is not None
                    header, _ = await w.client.call(
                        "health", timeout=max(0.05, min(self.settings.health_timeout_s, left))
                    )
                    answered = True
                    healthy = bool(header.get("ready"))
                    w.note_lifecycle(header.get("lifecycle"))
                    w.detail = "" if healthy else json.dumps(header.get("details"))
                except Exception as exc:
                    w.detail = f"health check failed: {type(exc).__name__}: {exc}"
                if answered:
                    last_answer = time.monotonic()
                elif time.monotonic() - last_answer >= self.settings.lost_after_s and not self._stopping:
                    silent = time.monotonic() - last_answer
                    w.state = "lost"
                    w.detail = f"no heartbeat answered for {silent:.1f}s"
                    log.error("worker %s (pid %s) lost: %s; killing it", w.plan.name, proc.pid, w.detail)
                    if w.client is not None:  # its in-flight items fail now, as worker_lost
                        w.client.abort(f"worker {w.plan.name} lost: {w.detail}")
                    await self._kill(proc)
                    return
                bad = 0 if healthy else bad + 1
                w.state = "ready" if healthy else "unhealthy"
                if bad >= self.settings.unhealthy_checks:
                    log.error("worker %s failed %d health checks; killing it", w.plan.name, bad)
                    await self._kill(proc)
                    return
        finally:
            if not exited.done():
                exited.cancel()

    async def _kill(self, proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        await proc.wait()

    async def stop(self) -> None:
        """SIGTERM every worker, SIGKILL stragglers after `stop_timeout_s`, then reap."""
        self._stopping = True
        procs = [w.proc for w in self.workers.values() if w.proc is not None and w.proc.returncode is None]
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        if procs:
            _, pending = await asyncio.wait(
                [asyncio.ensure_future(p.wait()) for p in procs], timeout=self.settings.stop_timeout_s
            )
            for p in procs:
                if p.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        p.kill()
            await asyncio.gather(*(p.wait() for p in procs))
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for w in self.workers.values():
            if w.client is not None:
                await w.client.close()
                w.client = None
            if w.proc is not None and w.proc.stdin is not None:
                w.proc.stdin.close()
            w.state = "stopped"
