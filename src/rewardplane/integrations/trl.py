"""Reward functions for TRL's `GRPOTrainer(reward_funcs=[...])` backed by a rewardplane service.

```python
from rewardplane.integrations.trl import RemoteReward
trainer = GRPOTrainer(model=..., reward_funcs=[RemoteReward("http://127.0.0.1:8000", scorer="rm")], ...)
```

TRL calls a reward function as `f(prompts=..., completions=..., completion_ids=..., **columns)`
and expects one `float | None` per completion. Rows are standard (strings) or conversational
(lists of `{"role", "content"}` messages); both are sent to `POST /v1/score` as the item's
`prompt` and `response` unchanged, so the service renders them exactly as `rewardplane eval` does.

TRL keys its metrics (`rewards/<name>/mean`) and completion-table columns by the function's
`__name__`: here `rewardplane_<scorer>` (or `name=`), so two scorers never collide.

`AsyncRemoteReward` is the same with `async def __call__`: TRL 1.16 detects it
(`inspect.iscoroutinefunction(f.__call__)`) and runs every async reward function of a step
concurrently on its own event-loop thread.

Failures: TRL turns `None` into NaN; a row where *every* reward function says None is left out
of its group's baseline and gets advantage 0, but with several reward functions TRL sums them
with `nansum`, so one function's None silently counts as 0 and shifts that row's scale. The
default (`on_error="raise"`) therefore raises `ScoreError` naming the failed rows;
`on_error="none"` returns None for them (and logs `<name>/failed_frac` through TRL's
`log_metric`). A whole-request failure (service down after retries, bad token, unknown scorer)
always raises `ServiceError`.

Audit (docs/audit.md): every item carries TRL's `trainer_state.global_step` as
`metadata.policy_version`; `audit=AuditCallback(...)` (`rewardplane.integrations.audit`) logs
the service's `audit/*` numbers through TRL's `log_metric`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal

from rewardplane.core.errors import UsageError
from rewardplane.integrations._common import (
    as_turns,
    pick_scorer,
    raise_failures,
    score_item,
    setting,
    split_results,
)
from rewardplane.serve.client import AsyncRewardClient, ItemScores, RewardClient

OnError = Literal["raise", "none"]


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
    ) -> None:
        if on_error not in ("raise", "none"):
            raise UsageError(f"on_error must be 'raise' or 'none', got {on_error!r}")
        if batch_size < 1:
            raise UsageError(f"batch_size must be >= 1, got {batch_size}")
        self.url = setting(url, "REWARDPLANE_URL", required=True, what="URL").rstrip("/")
        self.token = setting(token, "REWARDPLANE_TOKEN")
        self.on_error = on_error
        self.reference_key = reference_key
        self.batch_size = batch_size
        self._client_kwargs = {"token": self.token, "timeout": timeout, "max_retries": max_retries}
        scorer = setting(scorer, "REWARDPLANE_SCORER")
        if scorer is None:  # one look-up now, so the name TRL reads at construction is the real one
            with RewardClient(self.url, **self._client_kwargs) as client:
                scorer = pick_scorer(client.scorers(), self.url)
        self.scorer = scorer
        self.__name__ = name or f"rewardplane_{scorer}"
        self.audit = audit  # an integrations.audit.AuditCallback whose audit/* numbers TRL logs

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, scorer={self.scorer!r}, on_error={self.on_error!r})"

    def _items(self, prompts: Sequence[Any], completions: Sequence[Any], kwargs: dict) -> list[dict]:
        if len(prompts) != len(completions):
            raise UsageError(f"{len(prompts)} prompts but {len(completions)} completions")
        references = None
        if self.reference_key is not None:
            if self.reference_key not in kwargs:
                raise UsageError(
                    f"{self.__name__}: reference_key={self.reference_key!r} is not a dataset column "
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

    def _finish(self, results: list[ItemScores], log_metric: Callable | None) -> list[float | None]:
        if self.audit is not None and callable(log_metric):  # audit/* next to TRL's own metrics
            for key, value in self.audit.metrics.items():
                log_metric(key, value)
        values, failures = split_results(results, self.scorer)
        if self.on_error == "raise":
            raise_failures(failures, results)
        if callable(log_metric) and values:  # on_error="none": how much of the batch had no reward
            log_metric(f"{self.__name__}/failed_frac", len(failures) / len(values))
        return values

    def _chunks(self, items: list[dict]) -> list[list[dict]]:
        return [items[i : i + self.batch_size] for i in range(0, len(items), self.batch_size)]


class RemoteReward(_RemoteRewardBase):
    """A synchronous TRL reward function: `(prompts, completions, **kwargs) -> list[float | None]`.

    `url`, `scorer` and `token` default to `REWARDPLANE_URL`, `REWARDPLANE_SCORER` and
    `REWARDPLANE_TOKEN`; with no scorer, the service must host exactly one. `reference_key` names a
    dataset column sent as each item's `reference` (e.g. for `exact_match`). Requests of up to
    `batch_size` items; retries as `RewardClient` does (429/503/connection errors).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._local = threading.local()

    def _client(self) -> RewardClient:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = RewardClient(self.url, allow_partial=True, **self._client_kwargs)
        return client

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        items = self._items(prompts, completions, kwargs)
        results: list[ItemScores] = []
        for chunk in self._chunks(items):
            results.extend(self._client().score(chunk, [self.scorer]))
        return self._finish(results, kwargs.get("log_metric"))

    def close(self) -> None:
        client = getattr(self._local, "client", None)
        if client is not None:
            client.close()
            self._local.client = None

    def __getstate__(self) -> dict[str, Any]:  # picklable (no live connections)
        state = dict(self.__dict__)
        state.pop("_local", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()


class AsyncRemoteReward(_RemoteRewardBase):
    """`RemoteReward` with `async def __call__`, which TRL runs concurrently with its other async
    reward functions. Chunks of one call are sent concurrently. One connection pool per event
    loop (TRL uses one daemon loop; a caller's own `asyncio.run` gets its own pool)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clients: dict[int, tuple[asyncio.AbstractEventLoop, AsyncRewardClient]] = {}

    def _client(self) -> AsyncRewardClient:
        loop = asyncio.get_running_loop()
        for key, (other, _) in list(self._clients.items()):
            if other.is_closed():  # a finished asyncio.run: its connections are gone with it
                del self._clients[key]
        entry = self._clients.get(id(loop))
        if entry is None or entry[0] is not loop:
            entry = (loop, AsyncRewardClient(self.url, allow_partial=True, **self._client_kwargs))
            self._clients[id(loop)] = entry
        return entry[1]

    async def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        items = self._items(prompts, completions, kwargs)
        client = self._client()
        parts = await asyncio.gather(*(client.score(chunk, [self.scorer]) for chunk in self._chunks(items)))
        results = [r for part in parts for r in part]
        return self._finish(results, kwargs.get("log_metric"))

    async def aclose(self) -> None:
        entry = self._clients.pop(id(asyncio.get_running_loop()), None)
        if entry is not None:
            await entry[1].aclose()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_clients"] = {}
        return state
