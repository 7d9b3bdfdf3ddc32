"""Reward functions for TRL's `GRPOTrainer(reward_funcs=[...])` backed by a rewardplane service
(tested with TRL 1.16; usage, components and failures for users: docs/integrations.md, "TRL").

What the code below keeps to, and why:
- TRL calls `f(prompts=..., completions=..., completion_ids=..., **columns)` and wants one
  `float | None` per completion; rows (strings or message lists) go to `POST /v1/score`
  unchanged, so the service renders them as `rewardplane eval` does.
- `__name__` is `rewardplane_<scorer>` (or `name=`): TRL keys its metrics and columns by it.
- `AsyncRemoteReward` has `async def __call__`, which TRL detects and runs concurrently.
- `RemoteRewards` is one function per scorer or composite component (TRL's `reward_weights`,
  GDPO); the functions of one batch share one request: the first call sends it, the rest read it.
- `None` is dangerous in TRL (`nansum` turns it into 0 next to other functions), so a failed
  item raises `ScoreError` unless `on_error="none"`; a whole-request failure always raises.
- Every item carries `trainer_state.global_step` as `metadata.policy_version` for the audit.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal

from rewardplane.core.errors import UsageError
from rewardplane.integrations._common import (
    as_turns,
    check_penalty,
    composite_components,
    pick_scorer,
    raise_failures,
    score_item,
    setting,
    split_results,
)
from rewardplane.serve.client import AsyncRewardClient, ItemScores, RewardClient

OnError = Literal["raise", "none"]


class _Remote:
    """The service's address and the connection pools of the reward functions that call it: one
    client per thread (sync calls), one per event loop (async calls). Picklable, without its
    live connections."""

    def __init__(self, url: str | None, token: str | None, timeout: float, max_retries: int) -> None:
        self.url = setting(url, "REWARDPLANE_URL", required=True, what="URL").rstrip("/")
        self.token = setting(token, "REWARDPLANE_TOKEN")
        self.kwargs = {"token": self.token, "timeout": timeout, "max_retries": max_retries}
        self._local = threading.local()
        self._clients: dict[int, tuple[asyncio.AbstractEventLoop, AsyncRewardClient]] = {}

    def scorers(self) -> list[dict[str, Any]]:
        """`GET /v1/scorers`, once, at construction (names TRL reads before training)."""
        with RewardClient(self.url, **self.kwargs) as client:
            return client.scorers()

    def client(self) -> RewardClient:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = RewardClient(self.url, allow_partial=True, **self.kwargs)
        return client

    def async_client(self) -> AsyncRewardClient:
        loop = asyncio.get_running_loop()
        for key, (other, _) in list(self._clients.items()):
            if other.is_closed():  # a finished asyncio.run: its connections are gone with it
                del self._clients[key]
        entry = self._clients.get(id(loop))
        if entry is None or entry[0] is not loop:
            entry = (loop, AsyncRewardClient(self.url, allow_partial=True, **self.kwargs))
            self._clients[id(loop)] = entry
        return entry[1]

    def score(self, chunks: list[list[dict]], scorers: list[str]) -> list[ItemScores]:
        return [r for chunk in chunks for r in self.client().score(chunk, scorers)]

    async def ascore(self, chunks: list[list[dict]], scorers: list[str]) -> list[ItemScores]:
        client = self.async_client()
        parts = await asyncio.gather(*(client.score(chunk, scorers) for chunk in chunks))
        return [r for part in parts for r in part]

    def close(self) -> None:
        client = getattr(self._local, "client", None)
        if client is not None:
            client.close()
            self._local.client = None

    async def aclose(self) -> None:
        entry = self._clients.pop(id(asyncio.get_running_loop()), None)
        if entry is not None:
            await entry[1].aclose()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_local", "_clients")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local, self._clients = threading.local(), {}


class _Settings:
    """What every reward function of this module takes besides the service: failure policy,
    the dataset column sent as `reference`, request size, the audit callback."""

    def __init__(
        self,
        on_error: OnError,
        reference_key: str | None,
        batch_size: int,
        audit: Any,
        item_penalty: float | None = None,
    ) -> None:
        if on_error not in ("raise", "none"):
            raise UsageError(f"on_error must be 'raise' or 'none', got {on_error!r}")
        # the reward of an item-kind failure (the policy's doing); None: it follows on_error too
        self.item_penalty = check_penalty(item_penalty)
        if batch_size < 1:
            raise UsageError(f"batch_size must be >= 1, got {batch_size}")
        self.on_error, self.reference_key, self.batch_size = on_error, reference_key, batch_size
        self.audit = audit  # an integrations.audit.AuditCallback whose audit/* numbers TRL logs

    def items(
        self, name: str, prompts: Sequence[Any], completions: Sequence[Any], kwargs: dict
    ) -> list[dict]:
        """TRL's call as `POST /v1/score` items (prompt, response, reference, policy version)."""
        if len(prompts) != len(completions):
            raise UsageError(f"{len(prompts)} prompts but {len(completions)} completions")
        references = None
        if self.reference_key is not None:
            if self.reference_key not in kwargs:
                raise UsageError(
                    f"{name}: reference_key={self.reference_key!r} is not a dataset column "
                    f"(columns: {sorted(k for k in kwargs if not callable(kwargs[k]))})"
                )
            references = kwargs[self.reference_key]
        state = kwargs.get("trainer_state")  # TRL's TrainerState: the step is the policy version
        version = getattr(state, "global_step", None)
        # the service's audit groups items by it (docs/audit.md)
        metadata = {"policy_version": version} if isinstance(version, int) else None
        return [
            score_item(
                str(i),
                as_turns(prompt, f"prompts[{i}]"),
                as_turns(completion, f"completions[{i}]"),
                None if references is None else references[i],
                metadata,
            )
            for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True))
        ]

    def chunks(self, items: list[dict]) -> list[list[dict]]:
        return [items[i : i + self.batch_size] for i in range(0, len(items), self.batch_size)]

    def finish(
        self,
        name: str,
        results: list[ItemScores],
        log_metric: Callable | None,
        scorer: str,
        component: str | None = None,
        *,
        audit: bool = True,
    ) -> list[float | None]:
        """One column of values for TRL: the scorer's (or a composite component's) scores, its
        failures raised or None by `on_error`."""
        if audit and self.audit is not None and callable(log_metric):  # audit/* next to TRL's own
            for key, value in self.audit.metrics.items():
                log_metric(key, value)
        values, failures, penalised = split_results(
            results, scorer, component, item_penalty=self.item_penalty
        )
        if self.on_error == "raise":
            raise_failures(failures, results)
        if callable(log_metric) and values:  # on_error="none": how much of the batch had no reward
            log_metric(f"{name}/failed_frac", len(failures) / len(values))
            if self.item_penalty is not None:
                log_metric(f"{name}/penalised_frac", len(penalised) / len(values))
        return values


class _RemoteRewardBase:
    def __init__(
        self,
        url: str | None = None,
        scorer: str | None = None,
        token: str | None = None,
        on_error: OnError = "raise",
        *,
        name: str | None = None,
        reference_key: str | None = None,
        batch_size: int = 256,
        timeout: float = 120.0,
        max_retries: int = 6,
        audit: Any = None,
        item_penalty: float | None = None,
    ) -> None:
        self.settings = _Settings(on_error, reference_key, batch_size, audit, item_penalty)
        self.remote = _Remote(url, token, timeout, max_retries)
        self.url, self.token, self.on_error = self.remote.url, self.remote.token, on_error
        scorer = setting(scorer, "REWARDPLANE_SCORER")
        if scorer is None:  # one look-up now, so the name TRL reads at construction is the real one
            scorer = pick_scorer(self.remote.scorers(), self.url)
        self.scorer = scorer
        self.__name__ = name or f"rewardplane_{scorer}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, scorer={self.scorer!r}, on_error={self.on_error!r})"

    def _finish(self, results: list[ItemScores], log_metric: Callable | None) -> list[float | None]:
        return self.settings.finish(self.__name__, results, log_metric, self.scorer)


class RemoteReward(_RemoteRewardBase):
    """A synchronous TRL reward function: `(prompts, completions, **kwargs) -> list[float | None]`.

    `url`, `scorer` and `token` default to `REWARDPLANE_URL`, `REWARDPLANE_SCORER` and
    `REWARDPLANE_TOKEN`; with no scorer, the service must host exactly one. `reference_key` names a
    dataset column sent as each item's `reference` (e.g. for `exact_match`). Requests of up to
    `batch_size` items; retries as `RewardClient` does (429/503/connection errors).
    `item_penalty`: the reward of a failure of the item's own kind (a timeout, a crash, an
    unreadable judge answer: the policy's doing); service failures still follow `on_error`.
    """

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        items = self.settings.items(self.__name__, prompts, completions, kwargs)
        results = self.remote.score(self.settings.chunks(items), [self.scorer])
        return self._finish(results, kwargs.get("log_metric"))

    def close(self) -> None:
        self.remote.close()


class AsyncRemoteReward(_RemoteRewardBase):
    """`RemoteReward` with `async def __call__`, which TRL runs concurrently with its other async
    reward functions. Chunks of one call are sent concurrently. One connection pool per event
    loop (TRL uses one daemon loop; a caller's own `asyncio.run` gets its own pool)."""

    async def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        items = self.settings.items(self.__name__, prompts, completions, kwargs)
        results = await self.remote.ascore(self.settings.chunks(items), [self.scorer])
        return self._finish(results, kwargs.get("log_metric"))

    async def aclose(self) -> None:
        await self.remote.aclose()


class _Batch:
    """One batch's answer, shared by the functions of a `RemoteRewards`: the items it scored,
    the answer (a list, or the task that fetches it), and which functions have read it."""

    def __init__(self, items: list[dict], answer: Any) -> None:
        self.items, self.answer = items, answer
        self.read: set[int] = set()


class RemoteRewards(list):
    """TRL reward functions that share one request per batch: one per scorer (`scorers=[...]`)
    or one per component of a composite scorer (`composite=NAME`). A list: pass it as
    `reward_funcs` (or `[*rewards, other]`); `weights` fits `GRPOConfig.reward_weights`.

    The other arguments are `RemoteReward`'s. `asynchronous=True` makes every function async
    (awaited together by TRL; the first starts the request, the others await it)."""

    def __init__(
        self,
        url: str | None = None,
        scorers: Sequence[str] | None = None,
        *,
        composite: str | None = None,
        token: str | None = None,
        on_error: OnError = "raise",
        reference_key: str | None = None,
        batch_size: int = 256,
        timeout: float = 120.0,
        max_retries: int = 6,
        audit: Any = None,
        asynchronous: bool = False,
        prefix: str = "rewardplane_",
        item_penalty: float | None = None,
    ) -> None:
        super().__init__()
        if (scorers is None) == (composite is None):
            raise UsageError("RemoteRewards needs scorers=[...] or composite=NAME (one of them)")
        self.settings = _Settings(on_error, reference_key, batch_size, audit, item_penalty)
        self.remote = _Remote(url, token, timeout, max_retries)
        if composite is not None:
            listed = self.remote.scorers()
            components = composite_components(listed, composite, self.remote.url)
            self.requested = [composite]
            self.columns: list[tuple[str, str | None]] = [(composite, c["name"]) for c in components]
            self.weights: list[float] | None = _trl_weights(listed, composite, components)
        else:
            names = list(scorers or ())
            if not names or len(set(names)) != len(names):
                raise UsageError(f"scorers must be distinct scorer names, got {names}")
            self.requested = names
            self.columns = [(s, None) for s in names]
            self.weights = [1.0] * len(names)
        column = _AsyncColumn if asynchronous else _Column
        for k, (scorer, component) in enumerate(self.columns):
            self.append(column(self, k, prefix + scorer + (f".{component}" if component else "")))
        self._last: _Batch | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RemoteRewards({self.remote.url!r}, {[f.__name__ for f in self]})"

    def _shared(self, k: int, items: list[dict]) -> _Batch | None:
        """The batch function `k` reads, if another function has fetched it; None: fetch anew
        (a new batch, or `k` already read this one: TRL called it again)."""
        batch = self._last
        if batch is None or k in batch.read or batch.items != items:
            return None
        batch.read.add(k)
        return batch

    def _results(self, k: int, items: list[dict]) -> list[ItemScores]:
        with self._lock:  # TRL calls sync functions one after another; threads are serialised
            batch = self._shared(k, items)
            if batch is None:
                answer = self.remote.score(self.settings.chunks(items), self.requested)
                batch = self._last = _Batch(items, answer)
                batch.read.add(k)
            return batch.answer

    async def _aresults(self, k: int, items: list[dict]) -> list[ItemScores]:
        batch = self._shared(k, items)
        loop = asyncio.get_running_loop()
        if batch is None or batch.answer.get_loop() is not loop:
            task = loop.create_task(self.remote.ascore(self.settings.chunks(items), self.requested))
            batch = self._last = _Batch(items, task)
            batch.read.add(k)
        return await asyncio.shield(batch.answer)

    def _values(self, k: int, results: list[ItemScores], log_metric: Callable | None) -> list[float | None]:
        scorer, component = self.columns[k]
        return self.settings.finish(self[k].__name__, results, log_metric, scorer, component, audit=k == 0)

    def close(self) -> None:
        self.remote.close()

    async def aclose(self) -> None:
        await self.remote.aclose()

    def __getstate__(self) -> dict[str, Any]:  # picklable (no live connections, no batch)
        return {k: v for k, v in self.__dict__.items() if k not in ("_last", "_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._last, self._lock = None, threading.Lock()


def _trl_weights(listed: list[dict[str, Any]], composite: str, components: list[dict]) -> list[float] | None:
    """Weights under which TRL's weighted sum of the components equals the composite's total:
    its weights (`weighted_sum`), or normalised to sum to 1 (`mean`); None for `min` / `max`,
    which no weighted sum reproduces."""
    entry = next(s for s in listed if s.get("name") == composite)
    aggregation = (entry.get("options") or {}).get("aggregation", "weighted_sum")
    weights = [float(c.get("weight", 1.0)) for c in components]
    if aggregation == "weighted_sum":
        return weights
    if aggregation == "mean":
        return [w / sum(weights) for w in weights]
    return None


class _Column:
    """One function of a `RemoteRewards`: its column of the shared answer."""

    def __init__(self, owner: RemoteRewards, k: int, name: str) -> None:
        self.owner, self.k, self.__name__ = owner, k, name

    def __repr__(self) -> str:
        return f"<{self.__name__} of {self.owner!r}>"

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        items = self.owner.settings.items(self.__name__, prompts, completions, kwargs)
        return self.owner._values(self.k, self.owner._results(self.k, items), kwargs.get("log_metric"))


class _AsyncColumn(_Column):
    async def __call__(  # type: ignore[override]
        self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        items = self.owner.settings.items(self.__name__, prompts, completions, kwargs)
        results = await self.owner._aresults(self.k, items)
        return self.owner._values(self.k, results, kwargs.get("log_metric"))
