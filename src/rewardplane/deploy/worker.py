"""A scorer worker: one process hosting one or more scorers behind the Unix-socket transport.

`python -m rewardplane.deploy.worker --plan plan.json --socket /tmp/rkdeploy-x/w.sock`

The plan's environment (CUDA_VISIBLE_DEVICES, CUDA_MPS_*) is applied before torch is
imported, because CUDA reads it once at initialisation; the per-process memory fraction is
applied right after. Scorers run in the serve package's `InProcessBackend`, so a worker
batches exactly like the single-process service, and a consolidated worker (every scorer in
one process) shares one CUDA context and one event loop that drives all batchers.

The socket is bound only after every scorer has loaded and produced a finite warm-up score,
so "the socket accepts connections" already means "ready".

Every score answer also carries the request's queue/inference time and the batches the
worker ran since its last answer, so the gateway can fill `x-queue-time`/`x-inference-time`
and the batch histograms on its own `/metrics`: batching happens here, not in the gateway. The worker exits when its stdin
closes: if the supervisor dies, no orphan keeps holding GPU memory or an MPS client slot.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib
import json
import logging
import os
import signal
import sys
from typing import Any

from rewardplane.deploy.transport import TransportError, decode_items, encode_results, serve_unix
from rewardplane.serve.metrics import BatchStats, ServeMetrics
from rewardplane.serve.timing import RequestTiming, current_timing

log = logging.getLogger("rewardplane.deploy.worker")

EXIT_LOAD_FAILED = 3


def failure_path(socket_path: str) -> str:
    """Where a worker that failed to load leaves `{scorer: "failed: cause"}` for the supervisor."""
    return socket_path + ".failed"


def apply_environment(env: dict[str, str], memory_fraction: float | None) -> None:
    """Set CUDA env vars, then (only if needed) import torch and cap this process's memory."""
    os.environ.update(env)
    if memory_fraction is not None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.set_per_process_memory_fraction(memory_fraction, 0)


class RelayMetrics(ServeMetrics):
    """The worker's batcher metrics: every batch is also kept until the next answer relays it.

    Draining on any answer (not attributing batches to requests) observes each batch exactly
    once at the gateway, even when one batch served several requests.
    """

    def __init__(self) -> None:
        super().__init__()
        self._unsent: list[BatchStats] = []
        self.batches_run = 0  # what an opt-in profile window counts to (deploy/profiling.py)

    def observe_batch(self, stats: BatchStats) -> None:
        super().observe_batch(stats)
        self._unsent.append(stats)
        self.batches_run += 1

    def drain(self) -> list[dict[str, Any]]:
        out = [dataclasses.asdict(s) for s in self._unsent]
        self._unsent.clear()
        return out


class WorkerServer:
    """Maps transport ops onto an `InProcessBackend` (built with `metrics=server.metrics`).

    The backend decodes an image request's images on arrival, once per worker, before its
    items join the batch queue (`rewardplane.serve.prefetch`).
    """

    def __init__(self, backend: Any, metrics: RelayMetrics) -> None:
        self.backend = backend
        self.metrics = metrics

    async def handle(self, op: str, header: dict[str, Any], body: bytes) -> tuple[dict[str, Any], bytes]:
        if op == "score":
            items = decode_items(header.get("items"), body)
            scorer = str(header.get("scorer"))
            timing = RequestTiming()
            current_timing.set(timing)  # this request's own task: the batcher records into it
            results = await self.backend.score(scorer, items)  # images decode on arrival there
            return {
                "results": encode_results(results),
                "timing": {"queue_s": timing.queue_s, "inference_s": timing.inference_s},
                "batches": self.metrics.drain(),
            }, b""
        if op == "health":
            ready, details = self.backend.ready()
            infos = {n: dataclasses.asdict(i) for n, i in self.backend.scorer_infos().items()}
            states = self.backend.lifecycle.states()  # the gateway's /health/ready lists parked scorers
            return {
                "ready": ready,
                "details": details,
                "scorers": infos,
                "lifecycle": states,
                "pid": os.getpid(),
            }, b""
        if op == "lifecycle":  # offload / onload / drain (docs/lifecycle.md); ServeErrors keep their code
            scorers = header.get("scorers")
            names = [str(n) for n in scorers] if isinstance(scorers, list) else None
            timeout_s = header.get("timeout_s")
            timeout_s = float(timeout_s) if isinstance(timeout_s, int | float) else None
            action = str(header.get("action"))
            return {"results": await self.backend.lifecycle_action(action, names, timeout_s)}, b""
        if op == "lifecycle_state":
            return await self.backend.lifecycle_state(), b""
        raise TransportError(f"unknown op {op!r}")


def _exit_when_stdin_closes(loop: asyncio.AbstractEventLoop, leftovers: list[str]) -> None:
    """The supervisor holds our stdin; EOF means it is gone, so leave at once (even mid-load).

    Nobody else will clean up after a killed supervisor, so remove our socket and plan and,
    if we are the last worker out, the run directory.
    """
    fd = sys.stdin.fileno()

    def on_readable() -> None:
        try:
            data = os.read(fd, 4096)
        except OSError:
            data = b""
        if not data:
            for path in leftovers:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(leftovers[0]))
            os._exit(0)

    loop.add_reader(fd, on_readable)


def _log_profile_failure(task: asyncio.Task) -> None:
    # a failed trace must not stop the worker serving; it is said in the log, loudly
    if not task.cancelled() and task.exception() is not None:
        log.error("profile window failed: %r", task.exception())


async def run_worker(
    plan: dict[str, Any], socket_path: str, plan_path: str | None = None, watch_parent: bool = True
) -> int:
    if watch_parent:
        _exit_when_stdin_closes(
            asyncio.get_running_loop(), [socket_path] + ([plan_path] if plan_path else [])
        )
    for module in plan.get("imports", []):
        importlib.import_module(module)
    from rewardplane.deploy.profiling import ProfileWindow, profile_window
    from rewardplane.deploy.streams import OwnStream
    from rewardplane.serve.backend import InProcessBackend
    from rewardplane.serve.config import config_from_dict
    from rewardplane.serve.scorers.registry import build_scorer

    window = ProfileWindow.from_env()  # a bad setting fails here, before any model loads
    metrics = RelayMetrics()
    config = config_from_dict(plan["service"])
    scorers = [build_scorer(spec) for spec in config.scorers]
    # several scorers in one process (consolidated): each on its own CUDA stream, see streams.py
    hosted = [OwnStream(s) for s in scorers] if len(scorers) > 1 else scorers
    backend = InProcessBackend(config, metrics=metrics, scorers=hosted)
    await backend.start()
    ready, details = backend.ready()
    if not ready:
        log.error("worker %s failed to load: %s", plan.get("name"), json.dumps(details))
        # the supervisor reads this, so `rewardplane serve` can name the scorer and the cause
        with contextlib.suppress(OSError), open(failure_path(socket_path), "w", encoding="utf-8") as f:
            json.dump({n: str(s) for n, s in details.items() if s != "ready"}, f)
        return EXIT_LOAD_FAILED
    server = await serve_unix(socket_path, WorkerServer(backend, metrics).handle)
    log.info("worker %s ready on %s (pid %d)", plan.get("name"), socket_path, os.getpid())
    profiling = None
    if window is not None:
        name = str(plan.get("name", "worker"))
        profiling = asyncio.create_task(profile_window(window, lambda: metrics.batches_run, name))
        profiling.add_done_callback(_log_profile_failure)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    if profiling is not None:
        profiling.cancel()
    server.close()
    await backend.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rewardplane.deploy.worker")
    parser.add_argument("--plan", required=True, help="JSON plan written by the supervisor")
    parser.add_argument("--socket", required=True, help="Unix socket path to serve on")
    parser.add_argument("--no-parent-watch", action="store_true", help="keep running if stdin closes")
    args = parser.parse_args(argv)
    # `rewardplane serve --debug` sets REWARDPLANE_DEBUG: load failures then log their traceback here too
    level = logging.DEBUG if os.environ.get("REWARDPLANE_DEBUG") else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with open(args.plan, encoding="utf-8") as f:
        plan = json.load(f)
    apply_environment(plan.get("env", {}), plan.get("memory_fraction"))
    return asyncio.run(run_worker(plan, args.socket, args.plan, watch_parent=not args.no_parent_watch))


if __name__ == "__main__":
    sys.exit(main())
