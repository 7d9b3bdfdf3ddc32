"""Offload, onload and drain under `--backend ray`: one scorer, many replicas (docs/lifecycle.md).

Each Ray Serve replica runs the scorer's own `ScorerLifecycle` (`rewardplane.serve.lifecycle`),
exactly as a `--config` process does: admission, the per-scorer lock, idempotency, the moves
on the scorer's one thread. This module is the driver's side: an action is sent to every
running replica of the scorer with `DeploymentHandle.broadcast` (Ray Serve routes a plain
call to one replica), and the replicas' answers are merged into the shape `--config` mode
gives, plus `replicas` (each replica's own answer, by Ray's replica id).

- Actions on one scorer are serialised here too (one lock per scorer in the driver): two
  concurrent actions would otherwise reach the replicas in different orders and leave them
  in different states.
- The merged `state` is the replicas' common state, or `mixed` when they differ (a replica
  that failed to onload, one that Ray restarted resident, `per_call`/`auto_onload` replicas
  that moved on their own); `replicas` says which is where.
- A failure on any replica fails the action with that replica's code (503 `onload_failed`,
  `drain_timeout`, ...) and a message naming it and what every replica answered; the other
  replicas keep what they did, as `--config` mode does for several scorers.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from rewardplane.serve.lifecycle import gather_by_scorer, select_names
from rewardplane.serve.protocol import ServeError

log = logging.getLogger(__name__)

MIXED = "mixed"
"""The merged state of a scorer whose replicas are not all in the same state."""


def error_of(err: ServeError) -> dict[str, Any]:
    """A `ServeError` as plain data: Ray would otherwise wrap it in its own exception type."""
    return {"code": err.code, "message": err.message, "retry_after": err.retry_after}


def raise_error(raw: dict[str, Any]) -> None:
    """Raise the `ServeError` a replica answered with (`error_of`), its code and Retry-After kept."""
    raise ServeError(str(raw["code"]), str(raw["message"]), retry_after=raw.get("retry_after"))


def replica_lost(exc: BaseException) -> bool:
    """The replica process died or is gone (Ray Serve restarts it): not a scorer's own error."""
    from ray import exceptions as rex

    lost = (rex.RayActorError, rex.ActorUnavailableError, rex.WorkerCrashedError, rex.NodeDiedError)
    return isinstance(exc, lost) or isinstance(getattr(exc, "cause", None), lost)


def _common(states: list[str]) -> str:
    return states[0] if states and all(s == states[0] for s in states) else MIXED


def _latest(entries: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    present = [e for e in entries if e]
    return max(present, key=lambda e: e.get("at") or 0.0) if present else None


def merge_results(action: str, by_replica: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One scorer's action result from its replicas' results (`LifecycleResult` plus `replicas`):
    `changed` if any replica moved, bytes summed, seconds the slowest replica's (they move in
    parallel), `drained` only if every replica drained."""
    results = list(by_replica.values())
    merged: dict[str, Any] = {
        "action": action,
        "changed": any(r.get("changed") for r in results),
        "state": _common([r["state"] for r in results]),
    }
    transfers = [r["transfer"] for r in results if r.get("transfer")]
    if transfers:
        merged["transfer"] = {
            "bytes": sum(int(t.get("bytes") or 0) for t in transfers),
            "seconds": max(float(t.get("seconds") or 0.0) for t in transfers),
            "replicas": len(transfers),
        }
    ready = [r["ready_seconds"] for r in results if r.get("ready_seconds") is not None]
    if ready:
        merged["ready_seconds"] = max(ready)
    if any("drained" in r for r in results):
        merged["drained"] = all(r.get("drained", True) for r in results)
        merged["in_flight"] = sum(int(r.get("in_flight") or 0) for r in results)
    merged["replicas"] = by_replica
    return merged


def merge_states(by_replica: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One scorer's `GET /v1/lifecycle` entry from its replicas' (`ScorerLifecycleOut` plus
    `replicas`): counts and bytes summed, times the latest any replica saw."""
    described = list(by_replica.values())
    first = described[0]
    last_transition: dict[str, float] = {}
    for d in described:
        for state, at in d["last_transition"].items():
            last_transition[state] = max(at, last_transition.get(state, at))
    errors = [f"{replica}: {d['last_error']}" for replica, d in by_replica.items() if d.get("last_error")]
    return {
        "state": _common([d["state"] for d in described]),
        "residency": first["residency"],
        "auto_onload": first["auto_onload"],
        "idle_offload_s": first["idle_offload_s"],
        "in_flight": sum(d["in_flight"] for d in described),
        "bytes_on_device": sum(d["bytes_on_device"] for d in described),
        "bytes_total": sum(d["bytes_total"] for d in described),
        "since": max(d["since"] for d in described),
        "last_transition": last_transition,
        "transitions": sum(d["transitions"] for d in described),
        "last_offload": _latest([d.get("last_offload") for d in described]),
        "last_onload": _latest([d.get("last_onload") for d in described]),
        "last_error": "; ".join(errors)[:2000] or None,
        "replicas": by_replica,
    }


class RayLifecycle:
    """The driver's side of the lifecycle for a `RayBackend`: `handles` maps each deployed
    scorer to its `DeploymentHandle` (the backend's own dict, read live)."""

    def __init__(self, handles: dict[str, Any], names: list[str], *, request_timeout_s: float) -> None:
        self.handles = handles
        self.names = names
        self.request_timeout_s = request_timeout_s
        self.states: dict[str, str] = {}
        """Each scorer's merged state as last heard (action, GET, or the backend's poll)."""
        self._locks: dict[str, asyncio.Lock] = {}

    async def _broadcast(
        self, scorer: str, method: str, *args: Any, timeout_s: float
    ) -> list[dict[str, Any]]:
        """`method` on every running replica of `scorer`; their answers (each names its replica)."""
        from ray.serve.exceptions import DeploymentUnavailableError

        handle = self.handles.get(scorer)
        if handle is None:
            raise ServeError("not_ready", f"scorer {scorer!r} is not deployed", retry_after=2)
        try:
            outs = await handle.broadcast(method, *args).results_async(
                timeout_s=timeout_s, return_exceptions=True
            )
        except TimeoutError:
            raise ServeError("timeout", f"replicas of {scorer!r} did not answer in {timeout_s:g}s") from None
        except DeploymentUnavailableError:
            raise ServeError(
                "not_ready", f"scorer {scorer!r} has no running replica", retry_after=2
            ) from None
        for out in outs:
            if isinstance(out, BaseException):
                if replica_lost(out):
                    raise ServeError(
                        "not_ready", f"a replica of {scorer!r} died: {type(out).__name__}", retry_after=2
                    )
                raise out
        return outs

    async def _act(self, scorer: str, action: str, timeout_s: float | None) -> dict[str, Any]:
        lock = self._locks.setdefault(scorer, asyncio.Lock())
        budget = (30.0 if timeout_s is None else timeout_s) + self.request_timeout_s  # drain + the move
        async with lock:
            outs = await self._broadcast(scorer, "lifecycle_action", action, timeout_s, timeout_s=budget)
        by_replica = {
            o["replica"]: o.get("result") or {"state": o["state"], "error": o["error"]} for o in outs
        }
        merged = merge_results(action, by_replica)
        self.states[scorer] = merged["state"]
        failed = [(o["replica"], o["error"]) for o in outs if "error" in o]
        if failed:
            replica, error = failed[0]
            summary = {r: res.get("error", {}).get("code") or res["state"] for r, res in by_replica.items()}
            message = f"{error['message']} (replica {replica}; replicas: {summary})"[:2000]
            raise_error({**error, "message": message})
        return merged

    async def action(self, action: str, names: list[str] | None, timeout_s: float | None) -> dict[str, Any]:
        """`POST /v1/lifecycle/<action>`: every replica of each named scorer; results by scorer,
        the scorers in parallel and failures reported as for one process's scorers."""
        wanted = select_names(names, self.names)
        steps = {n: self._act(n, action, timeout_s) for n in wanted}
        return await gather_by_scorer(steps, self.states.get)

    async def state(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """`GET /v1/lifecycle`: each deployed scorer merged over its replicas; `processes` has the
        GPU memory of every replica process, keyed `scorer/replica`."""
        deployed = [n for n in self.names if n in self.handles]
        outs = await asyncio.gather(
            *(self._broadcast(n, "lifecycle_state", timeout_s=timeout_s) for n in deployed),
            return_exceptions=True,
        )
        scorers: dict[str, Any] = {}
        processes: dict[str, Any] = {}
        for name, answers in zip(deployed, outs, strict=True):
            if isinstance(answers, BaseException):
                if not isinstance(answers, ServeError):
                    raise answers
                processes[name] = {"error": error_of(answers)}
                continue
            scorers[name] = merge_states({a["replica"]: a["scorer"] for a in answers})
            self.states[name] = scorers[name]["state"]
            for a in answers:
                processes[f"{name}/{a['replica']}"] = {**a["memory"], "pid": a["pid"]}
        return {"scorers": scorers, "processes": processes}
