"""Share a GPU with the trainer over time: per-scorer offload, onload, drain and residency.

Each scorer has a state machine (docs/lifecycle.md):

    resident ──drain──▶ draining ──offload──▶ offloading ──▶ offloaded ──onload──▶ onloading ──▶ resident
        ▲                  │                                     ▲                       │
        └────onload────────┘                                     └── onload failed ──────┘

- `resident`: scoring. `draining`: admission stopped (new requests get 503 `draining` with
  `Retry-After`), in-flight requests finish; `onload` reopens admission. `offloading`: the
  weights move to pinned host memory on the scorer's own thread, so never under a batch.
  `offloaded`: requests get 503 `offloaded` at once (never a queue that waits forever) or, with
  `auto_onload`, wait for an onload they trigger. `onloading`: weights back, CUDA graphs
  re-captured, one warm-up scored to a finite value; requests arriving meanwhile wait for it.
- An onload that fails (CUDA out of memory because the trainer still holds it) is 503
  `onload_failed` with the bytes needed; the scorer stays `offloaded` and healthy, and a retry
  works. A drain that does not empty within its timeout is 503 `drain_timeout`; the scorer is
  admitting again.
- Transitions are serialised by one lock per scorer and idempotent: offloading an offloaded
  scorer (or onloading a resident one) is a successful no-op that says `changed: false`.
- `residency` (scorer config): `resident` (default; moves only when told), `on_demand` (loaded
  and warmed up at start, then offloaded; the first request onloads it; stays until told, or
  `idle_offload_s` idle), `per_call` (onloads for each batch window and offloads after
  `idle_offload_s` (default 1 s) without a request).

`ScorerLifecycle` holds one scorer's machine; `Lifecycle` all of a process's. The backend
wraps every score call in `admit(name)`; the HTTP routes (`rewardplane.serve.routes.lifecycle`)
call `offload`/`onload`/`drain` through the backend. What moves is `rewardplane.serve.weights`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from rewardplane.serve.protocol import LIFECYCLE_ACTIONS as ACTIONS
from rewardplane.serve.protocol import ServeError
from rewardplane.serve.residency import LifecyclePolicy, policy_of
from rewardplane.serve.weights import weights_of

log = logging.getLogger(__name__)

RESIDENT, DRAINING, OFFLOADING, OFFLOADED, ONLOADING = (
    "resident",
    "draining",
    "offloading",
    "offloaded",
    "onloading",
)
STATES = (RESIDENT, DRAINING, OFFLOADING, OFFLOADED, ONLOADING)

LIFECYCLE_ERROR_CODES = ("draining", "offloaded", "onload_failed", "drain_timeout", "offload_failed")
"""Whole-request codes the lifecycle raises (declared in `rewardplane.serve.protocol`)."""

RETRY_AFTER_S = 1.0


# --- one scorer's state machine -----------------------------------------------------------------


def _onload_message(name: str, exc: BaseException) -> str:
    needed = getattr(exc, "bytes_needed", None)
    text = f"scorer {name!r}: onload failed: {exc}"
    if needed is not None and "bytes" not in str(exc):
        text += f" (needs {needed} bytes)"
    return text[:500]


class ScorerLifecycle:
    """One scorer's states. `run(fn)` runs `fn` on the scorer's thread (its batcher's executor),
    so a transfer never overlaps a batch; `warmup()` scores one warm-up item after an onload and
    raises unless it is finite."""

    def __init__(
        self,
        name: str,
        weights: Any,
        *,
        run: Callable[[Callable[[], Any]], Awaitable[Any]],
        warmup: Callable[[], Awaitable[None]] | None = None,
        policy: LifecyclePolicy | None = None,
        drain_timeout_s: float = 30.0,
    ) -> None:
        self.name = name
        self.weights = weights
        self.run = run
        self.warmup = warmup
        self.policy = policy or LifecyclePolicy()
        self.drain_timeout_s = drain_timeout_s
        self.state = RESIDENT
        self.in_flight = 0
        self.transitions = 0
        self.last_error: str | None = None
        self.last_offload: dict[str, Any] | None = None
        self.last_onload: dict[str, Any] | None = None
        self.entered: dict[str, float] = {RESIDENT: time.time()}
        self._lock = asyncio.Lock()
        self._idle = asyncio.Event()
        self._idle.set()
        self._idle_task: asyncio.Task | None = None

    # --- admission ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def admit(self) -> AsyncIterator[None]:
        """Around one score call: 503 while draining/offloaded (or an onload, with auto_onload)."""
        await self._enter()
        try:
            yield
        finally:
            self._leave()

    async def _enter(self) -> None:
        while True:
            if self.state == RESIDENT:
                self.in_flight += 1
                self._idle.clear()
                if self._idle_task is not None:
                    self._idle_task.cancel()
                    self._idle_task = None
                return
            if self.state == DRAINING:
                raise ServeError(
                    "draining",
                    f"scorer {self.name!r} is draining (admission stopped; POST /v1/lifecycle/onload,"
                    " or client.onload(), admits again)",
                    retry_after=RETRY_AFTER_S,
                )
            if self.state == ONLOADING:  # already on its way back: wait for it, bounded by the onload
                async with self._lock:
                    pass
                if self.state == OFFLOADED and not self.policy.onloads_on_request:
                    raise ServeError(
                        "onload_failed",
                        f"scorer {self.name!r}: {self.last_error or 'onload failed'}",
                        retry_after=RETRY_AFTER_S,
                    )
                continue
            if not self.policy.onloads_on_request:
                raise ServeError(
                    "offloaded",
                    f"scorer {self.name!r} is {self.state}; POST /v1/lifecycle/onload?scorer={self.name}",
                    retry_after=RETRY_AFTER_S,
                )
            await self.onload(reason="request")

    def _leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()
            self._schedule_idle_offload()

    def _schedule_idle_offload(self) -> None:
        idle_s = self.policy.idle_s
        if idle_s is None or self.state != RESIDENT or self.in_flight:
            return
        if self._idle_task is not None:
            self._idle_task.cancel()
        self._idle_task = asyncio.get_running_loop().create_task(
            self._idle_offload(idle_s), name=f"idle-offload-{self.name}"
        )

    async def _idle_offload(self, idle_s: float) -> None:
        await asyncio.sleep(idle_s)
        self._idle_task = None
        if self.state != RESIDENT or self.in_flight:
            return
        try:
            await self.offload(timeout_s=0.0, reason="idle")
        except ServeError as exc:  # a request came in meanwhile, or the move failed (logged)
            log.info("scorer %s: idle offload skipped: %s", self.name, exc.message)

    # --- transitions -------------------------------------------------------------------------

    def _set(self, state: str) -> None:
        self.state = state
        self.entered[state] = time.time()
        self.transitions += 1

    async def _wait_idle(self, timeout_s: float) -> bool:
        if self.in_flight == 0:
            return True
        if timeout_s <= 0:
            return False
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return self.in_flight == 0

    def _result(self, action: str, changed: bool, **extra: Any) -> dict[str, Any]:
        return {"action": action, "changed": changed, "state": self.state, **extra}

    async def drain(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Stop admission and wait (up to `timeout_s`) for in-flight requests to finish."""
        timeout_s = self.drain_timeout_s if timeout_s is None else timeout_s
        async with self._lock:
            if self.state in (OFFLOADED,):
                return self._result("drain", False, drained=True, in_flight=0)
            changed = self.state == RESIDENT
            if changed:
                self._set(DRAINING)
            drained = await self._wait_idle(timeout_s)
            return self._result("drain", changed, drained=drained, in_flight=self.in_flight)

    async def offload(self, timeout_s: float | None = None, *, reason: str = "request") -> dict[str, Any]:
        """Drain, then move the weights to host memory and release the device memory."""
        timeout_s = self.drain_timeout_s if timeout_s is None else timeout_s
        async with self._lock:
            if self.state == OFFLOADED:
                return self._result("offload", False)
            previous = self.state
            if previous == RESIDENT:
                self._set(DRAINING)
            if not await self._wait_idle(timeout_s):
                if previous == RESIDENT:
                    self._set(RESIDENT)
                    self._schedule_idle_offload()
                raise ServeError(
                    "drain_timeout",
                    f"scorer {self.name!r}: {self.in_flight} request(s) still in flight after {timeout_s:g}s;"
                    " nothing was offloaded",
                    retry_after=RETRY_AFTER_S,
                )
            self._set(OFFLOADING)
            try:
                transfer = await self.run(self.weights.offload)
            except Exception as exc:
                log.exception("scorer %s: offload failed", self.name)
                self.last_error = f"offload failed: {type(exc).__name__}: {exc}"[:500]
                self._set(RESIDENT)
                raise ServeError("offload_failed", f"scorer {self.name!r}: {self.last_error}") from None
            self._set(OFFLOADED)
            self.last_offload = {**transfer, "reason": reason, "at": self.entered[OFFLOADED]}
            log.info("scorer %s offloaded (%s): %s", self.name, reason, transfer)
            return self._result("offload", True, transfer=transfer)

    async def onload(self, *, reason: str = "request") -> dict[str, Any]:
        """Weights back, graphs re-captured, one finite warm-up; or reopen admission after a drain."""
        async with self._lock:
            if self.state == RESIDENT:
                return self._result("onload", False)
            if self.state == DRAINING:  # weights never left: admission reopens
                self._set(RESIDENT)
                self._schedule_idle_offload()
                return self._result("onload", True)
            self._set(ONLOADING)
            started = time.perf_counter()
            try:
                transfer = await self.run(self.weights.onload)
            except Exception as exc:
                self.last_error = _onload_message(self.name, exc)
                log.warning("%s", self.last_error)
                self._set(OFFLOADED)
                raise ServeError("onload_failed", self.last_error, retry_after=RETRY_AFTER_S) from None
            if self.warmup is not None:
                try:
                    await self.warmup()
                except Exception as exc:
                    self.last_error = f"scorer {self.name!r}: warm-up after onload failed: {exc}"[:500]
                    log.warning("%s", self.last_error)
                    with contextlib.suppress(Exception):
                        await self.run(self.weights.offload)
                    self._set(OFFLOADED)
                    raise ServeError("onload_failed", self.last_error, retry_after=RETRY_AFTER_S) from None
            self._set(RESIDENT)
            self.last_error = None
            ready_s = time.perf_counter() - started
            self.last_onload = {
                **transfer,
                "ready_seconds": ready_s,
                "reason": reason,
                "at": self.entered[RESIDENT],
            }
            log.info("scorer %s onloaded (%s) in %.3f s: %s", self.name, reason, ready_s, transfer)
            self._schedule_idle_offload()
            return self._result("onload", True, transfer=transfer, ready_seconds=ready_s)

    async def start_offloaded(self) -> None:
        """`on_demand` scorers: loaded and warmed up, then offloaded until the first request."""
        await self.offload(reason="on_demand")

    async def started(self) -> None:
        """Call once the scorer is loaded and warmed up: `on_demand` offloads now, `per_call`
        offloads after its idle time unless a request comes first."""
        if self.policy.residency == "on_demand":
            await self.start_offloaded()
        else:
            self._schedule_idle_offload()

    def close(self) -> None:
        if self._idle_task is not None:
            self._idle_task.cancel()
            self._idle_task = None

    # --- what GET /v1/lifecycle and /health/ready report --------------------------------------

    def describe(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "residency": self.policy.residency,
            "auto_onload": self.policy.onloads_on_request,
            "idle_offload_s": self.policy.idle_s,
            "in_flight": self.in_flight,
            "bytes_on_device": self.weights.bytes_on_device(),
            "bytes_total": self.weights.bytes_total(),
            "since": self.entered[self.state],
            "last_transition": dict(self.entered),
            "transitions": self.transitions,
            "last_offload": self.last_offload,
            "last_onload": self.last_onload,
            "last_error": self.last_error,
        }


# --- every scorer of a process ------------------------------------------------------------------


def select_names(names: list[str] | None, known: list[str]) -> list[str]:
    """The scorers an action names, once each (None or empty: all `known`). An unknown name is
    422 `unknown_scorer`: every backend (in-process, --deploy, Ray) refuses it the same way."""
    if not names:
        return list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ServeError("unknown_scorer", f"unknown scorers {unknown}; known: {sorted(known)}")
    return list(dict.fromkeys(names))


async def gather_by_scorer(
    steps: dict[str, Awaitable[Any]], state_of: Callable[[str], Any]
) -> dict[str, Any]:
    """Run one action's steps (one per scorer) in parallel; their results by scorer. If any step
    raised a `ServeError`, raise the first, its message saying what happened to the others too:
    the scorers that moved stay moved (each transition is whole on its own)."""
    names = list(steps)
    outs = await asyncio.gather(*steps.values(), return_exceptions=True)
    results: dict[str, Any] = {}
    first_error: ServeError | None = None
    for name, out in zip(names, outs, strict=True):
        if isinstance(out, BaseException):
            if not isinstance(out, ServeError):
                raise out
            first_error = first_error or out
            results[name] = {"state": state_of(name), "error": {"code": out.code, "message": out.message}}
        else:
            results[name] = out
    if first_error is not None:
        if len(names) > 1:
            first_error.message = f"{first_error.message} (all: {results})"[:2000]
        raise first_error
    return results


class Lifecycle:
    """The lifecycle of every hosted scorer, by name."""

    def __init__(self) -> None:
        self.scorers: dict[str, ScorerLifecycle] = {}

    def add(self, machine: ScorerLifecycle) -> None:
        self.scorers[machine.name] = machine

    def select(self, names: list[str] | None) -> list[ScorerLifecycle]:
        """The named scorers (None or empty: all). An unknown name is 422 `unknown_scorer`."""
        return [self.scorers[n] for n in select_names(names, list(self.scorers))]

    def admit(self, name: str) -> contextlib.AbstractAsyncContextManager[None]:
        machine = self.scorers.get(name)
        return machine.admit() if machine is not None else contextlib.nullcontext()

    async def _each(self, names: list[str] | None, step: Callable[[ScorerLifecycle], Awaitable]) -> dict:
        machines = self.select(names)
        return await gather_by_scorer({m.name: step(m) for m in machines}, lambda n: self.scorers[n].state)

    async def offload(self, names: list[str] | None = None, timeout_s: float | None = None) -> dict[str, Any]:
        return await self._each(names, lambda m: m.offload(timeout_s))

    async def onload(self, names: list[str] | None = None) -> dict[str, Any]:
        return await self._each(names, lambda m: m.onload())

    async def drain(self, names: list[str] | None = None, timeout_s: float | None = None) -> dict[str, Any]:
        return await self._each(names, lambda m: m.drain(timeout_s))

    def describe(self) -> dict[str, Any]:
        return {name: m.describe() for name, m in self.scorers.items()}

    def states(self) -> dict[str, str]:
        return {name: m.state for name, m in self.scorers.items()}

    def close(self) -> None:
        for m in self.scorers.values():
            m.close()


# --- what a backend needs to host lifecycles -----------------------------------------------------

PARKED = (DRAINING, OFFLOADING, OFFLOADED, ONLOADING)
"""States in which a scorer is healthy but not scoring right now (/health/ready stays 200)."""


async def warm_up(scorer: Any, run: Callable[[Callable[[], Any]], Awaitable[Any]]) -> None:
    """Score the scorer's warm-up item on its thread; raise unless the value is finite."""
    from rewardplane.serve.batcher import check_value
    from rewardplane.serve.protocol import ItemError

    warm = await run(lambda: scorer.score_batch([scorer.warmup_item()]))
    ok = isinstance(warm, list | tuple) and len(warm) == 1
    value = check_value(warm[0]) if ok else ItemError("scorer_failed", "no value")
    if isinstance(value, ItemError) or not math.isfinite(value):
        raise RuntimeError(f"warm-up did not produce a finite score: {value}")


def scorer_lifecycle(
    scorer: Any, run: Callable[[Callable[[], Any]], Awaitable[Any]], spec: Any = None
) -> ScorerLifecycle:
    """The state machine for a loaded, warmed-up scorer whose batches run through `run`."""
    return ScorerLifecycle(
        scorer.name,
        weights_of(scorer),
        run=run,
        warmup=lambda: warm_up(scorer, run),
        policy=policy_of(spec) if spec is not None else None,
    )


def merge_ready(details: dict[str, Any], states: dict[str, str]) -> tuple[bool, dict[str, Any]]:
    """/health/ready's view: a parked scorer (offloaded, draining, ...) is healthy and says so."""
    merged = dict(details)
    for name, state in states.items():
        if state in PARKED and merged.get(name) == "ready":
            merged[name] = state
    ok = bool(merged) and all(v == "ready" or v in PARKED for v in merged.values())
    return ok, merged


async def run_action(
    lifecycle: Lifecycle, action: str, names: list[str] | None, timeout_s: float | None
) -> dict:
    """One `/v1/lifecycle/<action>` on this process's scorers: results by scorer name."""
    if action == "offload":
        return await lifecycle.offload(names, timeout_s)
    if action == "onload":
        return await lifecycle.onload(names)
    if action == "drain":
        return await lifecycle.drain(names, timeout_s)
    raise ServeError("invalid_request", f"unknown lifecycle action {action!r}; known: {list(ACTIONS)}")


async def describe_process(lifecycle: Lifecycle, process: str = "server") -> dict[str, Any]:
    """`GET /v1/lifecycle` for one process: its scorers and the GPU memory it holds."""
    from rewardplane.models.offload import device_memory

    memory = await asyncio.to_thread(device_memory)
    return {"scorers": lifecycle.describe(), "processes": {process: memory}}
