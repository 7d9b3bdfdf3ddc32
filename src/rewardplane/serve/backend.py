"""What the HTTP app talks to: a `ScoringBackend`. `InProcessBackend` hosts scorers in this process.

The app never touches scorers directly, so the same app serves an in-process backend (one
dynamic batcher per scorer) or the deploy gateway (items forwarded to worker processes, which
can fail per item with `worker_lost`). A backend returns one `ItemResult` per item, in order:
a finite float or an `ItemError`; whole-request problems are raised as `ServeError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, runtime_checkable

from rewardplane.serve.batcher import DynamicBatcher, ItemResult, check_value
from rewardplane.serve.config import ServiceConfig
from rewardplane.serve.lifecycle import Lifecycle, describe_process, merge_ready, run_action, scorer_lifecycle
from rewardplane.serve.metrics import ServeMetrics
from rewardplane.serve.prefetch import SharedDecoder, share_image_decoding
from rewardplane.serve.protocol import ItemError, ScoreItem, ScorerInfo, ServeError
from rewardplane.serve.scorers.base import Scorer
from rewardplane.serve.scorers.registry import build_scorer
from rewardplane.serve.timing import record_timing

__all__ = ["InProcessBackend", "ItemError", "ItemResult", "ScoringBackend", "record_timing"]

log = logging.getLogger(__name__)


@runtime_checkable
class ScoringBackend(Protocol):
    async def start(self) -> None:
        """Load scorers and warm them up. The app runs this in the background; /health/ready waits."""

    async def stop(self) -> None: ...

    async def score(self, scorer: str, items: list[ScoreItem]) -> list[ItemResult]:
        """One result per item, in order. Raise `ServeError` (queue_full, queue_timeout, ...)."""

    def scorer_infos(self) -> dict[str, ScorerInfo]:
        """Loaded scorers by name (may be empty while loading)."""

    def scorer_names(self) -> list[str]:
        """Every configured scorer name, loaded or not (unknown vs not-yet-ready)."""

    def ready(self) -> tuple[bool, dict[str, Any]]:
        """(all scorers loaded, warmed up with a finite score, and not broken; per-scorer details)."""


class InProcessBackend:
    """One `DynamicBatcher` per configured scorer, all in this process."""

    def __init__(
        self,
        config: ServiceConfig,
        *,
        metrics: ServeMetrics | None = None,
        scorers: list[Scorer] | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self._prebuilt = scorers
        self.images: dict[str, SharedDecoder] = {}  # scorer name → decoder its requests prefetch into
        self._batchers: dict[str, DynamicBatcher] = {}
        self._infos: dict[str, ScorerInfo] = {}
        self._status: dict[str, str] = {s.name: "pending" for s in config.scorers}
        self._scorers: dict[str, Scorer] = {}
        self._refs: dict[str, tuple[str, ...]] = {}  # scorer → the hosted scorers it scores through
        self.lifecycle = Lifecycle()  # offload / onload / drain per scorer (docs/lifecycle.md)

    def attach_metrics(self, metrics: ServeMetrics) -> None:
        self.metrics = metrics
        for b in self._batchers.values():
            b.metrics = metrics

    async def start(self) -> None:
        scorers = _referenced_first(self._prebuilt or [build_scorer(spec) for spec in self.config.scorers])
        specs = {s.name: s for s in self.config.scorers}
        loop = asyncio.get_running_loop()
        for scorer in scorers:
            spec = specs.get(scorer.name)
            refs = scorer.hosted_references()
            if refs:
                unusable = [r for r in refs if r not in self._batchers or self._refs.get(r)]
                if unusable:
                    cause = (
                        f"names hosted scorers {unusable}, which this process does not host, which "
                        "failed to load, or which name hosted scorers themselves"
                    )
                    log.error("scorer %s failed to load: %s", scorer.name, cause)
                    self._status[scorer.name] = f"failed: {cause}"[:300]
                    continue
                scorer.bind_hosted({r: HostedScorer(self, r, loop) for r in refs})
            # image scorers refuse oversized images per item at admission (docs/reliability.md)
            limit_pixels = getattr(getattr(scorer, "inner", scorer), "limit_image_pixels", None)
            if limit_pixels is not None:
                limit_pixels(self.config.limits.max_image_pixels)
            batcher = DynamicBatcher(
                scorer,
                max_batch_size=spec.max_batch_size if spec else scorer.max_batch_size,
                max_wait_ms=spec.max_wait_ms if spec else scorer.max_wait_ms,
                max_queue=spec.max_queue if spec else 4096,
                token_budget=spec.token_budget if spec else None,
                queue_timeout_s=self.config.limits.queue_timeout_s,
                metrics=self.metrics,
            )
            self._status.setdefault(scorer.name, "pending")
            self._status[scorer.name] = "loading"
            try:
                await batcher.run_in_thread(scorer.load)
                warm = await batcher.run_in_thread(scorer.score_batch, [scorer.warmup_item()])
                value = check_value(warm[0]) if len(warm) == 1 else ItemError("scorer_failed", "no value")
                if isinstance(value, ItemError):  # its code and message as written, never a repr
                    raise RuntimeError(f"warm-up failed: {value.code}: {value.message}")
                if not math.isfinite(value):
                    raise RuntimeError(f"warm-up did not produce a finite score: {value}")
            except Exception as exc:
                cause = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line
                # one line; the traceback only at debug level (`rewardplane serve --debug`)
                log.error(
                    "scorer %s failed to load: %s",
                    scorer.name,
                    cause[:500],
                    exc_info=log.isEnabledFor(logging.DEBUG),
                )
                self._status[scorer.name] = f"failed: {cause}"[:300]
                continue
            batcher.start()
            self._batchers[scorer.name] = batcher
            self._scorers[scorer.name] = scorer
            self._refs[scorer.name] = refs
            self._infos[scorer.name] = scorer.info()
            self._status[scorer.name] = "ready"
            machine = scorer_lifecycle(scorer, batcher.run_in_thread, spec)
            if refs:  # its warm-up after an onload scores through them: admitted like a request
                machine.warmup = self._admitted_warmup(refs, machine.warmup)
            self.lifecycle.add(machine)
            log.info("scorer %s ready (%s)", scorer.name, self._infos[scorer.name].identity[:12])
        if self.config.prefetch_images:
            self.images = share_image_decoding([s for s in scorers if s.name in self._batchers])
            if self.images:
                log.info("images decoded on arrival, shared by %s", sorted(self.images))
        for machine in self.lifecycle.scorers.values():
            await machine.started()  # on_demand: offloaded now; per_call: after its idle time

    async def stop(self) -> None:
        self.lifecycle.close()
        await asyncio.gather(*(b.stop() for b in self._batchers.values()))
        self._batchers.clear()
        for shared in {id(d): d for d in self.images.values()}.values():
            shared.close()
        self.images = {}

    async def score(self, scorer: str, items: list[ScoreItem]) -> list[ItemResult]:
        self._batcher(scorer)
        # 503 draining/offloaded, or an auto onload: the hosted scorers it names first, so an
        # auto onload of a composite finds them resident
        async with self._admitted((*self._refs.get(scorer, ()), scorer)):
            return await self.submit(scorer, items)

    def _batcher(self, scorer: str) -> DynamicBatcher:
        batcher = self._batchers.get(scorer)
        if batcher is None:
            raise ServeError(
                "not_ready", f"scorer {scorer!r} is {self._status.get(scorer, 'unknown')}", retry_after=5
            )
        return batcher

    @contextlib.asynccontextmanager
    async def _admitted(self, names: tuple[str, ...]) -> AsyncIterator[None]:
        """Through each named scorer's lifecycle, in order (released in reverse)."""
        async with contextlib.AsyncExitStack() as stack:
            for name in names:
                await stack.enter_async_context(self.lifecycle.admit(name))
            yield

    def _admitted_warmup(self, refs: tuple[str, ...], warmup: Any) -> Any:
        async def run() -> None:
            async with self._admitted(refs):
                await warmup()

        return run

    async def submit(self, scorer: str, items: list[ScoreItem]) -> list[ItemResult]:
        """Queue `items` on the scorer's batcher, without admission: `score` admits, and a
        hosted scorer's handle scores under the admission of the request that called it."""
        batcher = self._batcher(scorer)
        shared = self.images.get(scorer)
        if shared is None:
            return await batcher.submit(items)
        held = shared.hold([i.image for i in items if i.image])
        try:
            await shared.ready(held)  # decoded before the items queue: overlaps earlier forwards
            return await batcher.submit(items)
        finally:
            shared.release(held)

    async def lifecycle_action(self, action: str, names: list[str] | None, timeout_s: float | None) -> dict:
        """`POST /v1/lifecycle/<action>`: results by scorer (docs/lifecycle.md)."""
        return await run_action(self.lifecycle, action, names, timeout_s)

    async def lifecycle_state(self) -> dict[str, Any]:
        """`GET /v1/lifecycle`: every scorer's state and this process's GPU memory."""
        return await describe_process(self.lifecycle)

    def scorer_infos(self) -> dict[str, ScorerInfo]:
        return dict(self._infos)

    def scorer_names(self) -> list[str]:
        return list(self._status)

    def inline_scorer(self, scorer: str) -> Callable[[list[ScoreItem]], list[ItemResult]] | None:
        """A call that scores `scorer`'s items in the calling thread, when it is a text rule hosted
        here (`Scorer.item_deadline_s`: linear, no device), scores through no other scorer and is
        `resident`; else None, and its items go through `score` (a drained or offloaded one
        answers there as it does every request). For the audit, which scores a rule auditor's
        whole batch in the thread it records the batch in (`serve/audit/stream.py`)."""
        batcher = self._batchers.get(scorer)
        if batcher is None or batcher.scorer.item_deadline_s is None or self._refs.get(scorer):
            return None
        machine = self.lifecycle.scorers.get(scorer)
        if machine is not None and machine.state != "resident":
            return None
        return batcher.score_inline

    def queue_depths(self) -> dict[str, int]:
        return {name: b.depth for name, b in self._batchers.items()}

    def ready(self) -> tuple[bool, dict[str, Any]]:
        details: dict[str, Any] = {}
        for name, status in self._status.items():
            batcher = self._batchers.get(name)
            if batcher is not None and batcher.broken:
                status = f"broken: {batcher.consecutive_failures} consecutive failed batches"
            details[name] = status
        return merge_ready(details, self.lifecycle.states())  # offloaded/draining: healthy, says so


class HostedScorer:
    """A handle on a scorer this backend hosts, for a scorer that scores through it (a
    composite's `scorer:` component). `score_batch` runs on the caller's scoring thread and
    waits for the hosted scorer's own batcher on the event loop, so the items share its batches
    with direct requests; admission (its lifecycle) is the calling request's, taken in `score`."""

    def __init__(self, backend: InProcessBackend, name: str, loop: asyncio.AbstractEventLoop) -> None:
        self.backend = backend
        self.name = name
        self.loop = loop

    def score_batch(self, items: list[ScoreItem]) -> list[ItemResult]:
        return asyncio.run_coroutine_threadsafe(self.backend.submit(self.name, items), self.loop).result()

    def warmup_item(self) -> ScoreItem:
        return self.backend._scorers[self.name].warmup_item()

    def info(self) -> ScorerInfo:
        return self.backend._infos[self.name]

    @property
    def lowest_score(self) -> float | None:
        return self.backend._scorers[self.name].lowest_score

    def item_fields(self) -> frozenset[str]:
        return self.backend._scorers[self.name].item_fields()


def _referenced_first(scorers: list[Scorer]) -> list[Scorer]:
    """Scorers named by others load (and warm up) before those that score through them."""
    named = {r for s in scorers for r in s.hosted_references()}
    return sorted(scorers, key=lambda s: (s.name not in named, bool(s.hosted_references())))
