"""verl `custom_reward_function`s backed by a rewardplane service (verl 0.9; docs/integrations.md).

```
reward.custom_reward_function.path=pkg://rewardplane.integrations.verl
reward.custom_reward_function.name=compute_score          # naive manager (the default)
+reward.custom_reward_function.reward_kwargs.url=http://127.0.0.1:8000
+reward.custom_reward_function.reward_kwargs.scorer=rm
```

- `compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float`:
  one sample, for the naive reward manager (verl runs it in a thread pool, one call per sample).
- `compute_score_async(...)`: the same as a coroutine; verl's reward-loop managers detect it
  (`inspect.iscoroutinefunction`) and await it on their event loop instead of a thread.
- `compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos, **kwargs) -> list[float]`:
  the whole batch in one request per `batch_size` items, for the batch reward manager.

verl passes only the response (`solution_str`, decoded with special tokens stripped), never the
prompt. The prompt is read from `extra_info["prompt"]`, else `extra_info["question"]` (verl's
data-preparation scripts store the question there): a string, or `{role, content}` messages. A
scorer that needs a prompt (every kind except the rule scorers `exact_match`, `regex`, `length`)
raises `UsageError` when neither is there. `ground_truth` is sent as the item's `reference`.

Settings: `url`, `scorer`, `token` (and `timeout`, `max_retries`, `batch_size`) from verl's
`reward_kwargs`, else `REWARDPLANE_URL` / `REWARDPLANE_SCORER` / `REWARDPLANE_TOKEN`; with no scorer the
service must host exactly one. Other keyword arguments verl adds are ignored.

A failed score raises (`ScoreError` for item errors, `ServiceError` for a whole-request error,
httpx's error when the service cannot be reached after the retries); it is never 0.0. Beware
verl's own wrappers that turn exceptions into 0.0: the `rate_limited` reward manager (any
exception) and `compute_score_timeout` of the legacy naive manager (TimeoutError).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from rewardplane.core.errors import UsageError
from rewardplane.integrations._common import (
    as_reference,
    as_turns,
    pick_scorer,
    raise_failures,
    setting,
    split_results,
)
from rewardplane.serve.client import AsyncRewardClient, ItemScores, RewardClient

# Scorer kinds that read only the response (and `reference`); every other kind needs the prompt.
PROMPTLESS_KINDS = frozenset({"exact_match", "regex", "length"})
PROMPT_KEYS = ("prompt", "question")

_lock = threading.Lock()
_clients: dict[tuple, RewardClient] = {}
_async_clients: dict[tuple, tuple[asyncio.AbstractEventLoop, AsyncRewardClient]] = {}
_kinds: dict[tuple[str, str], str] = {}
_default_scorer: dict[str, str] = {}


def _settings(kwargs: Mapping[str, Any]) -> tuple[str, str | None, str | None, dict[str, Any], int]:
    url = setting(kwargs.get("url"), "REWARDPLANE_URL", required=True, what="URL").rstrip("/")
    scorer = setting(kwargs.get("scorer"), "REWARDPLANE_SCORER")
    token = setting(kwargs.get("token"), "REWARDPLANE_TOKEN")
    client_kwargs = {"token": token, "allow_partial": True}
    for key in ("timeout", "max_retries"):
        if kwargs.get(key) is not None:
            client_kwargs[key] = kwargs[key]
    batch_size = int(kwargs.get("batch_size") or 256)
    if batch_size < 1:
        raise UsageError(f"batch_size must be >= 1, got {batch_size}")
    return url, scorer, token, client_kwargs, batch_size


def _client(url: str, client_kwargs: dict[str, Any]) -> RewardClient:
    key = (url, *sorted(client_kwargs.items()))
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = RewardClient(url, **client_kwargs)
    return client


def _async_client(url: str, client_kwargs: dict[str, Any]) -> AsyncRewardClient:
    loop = asyncio.get_running_loop()
    key = (id(loop), url, *sorted(client_kwargs.items()))
    with _lock:
        for k, (other, _) in list(_async_clients.items()):
            if other.is_closed():
                del _async_clients[k]
        entry = _async_clients.get(key)
        if entry is None or entry[0] is not loop:
            entry = _async_clients[key] = (loop, AsyncRewardClient(url, **client_kwargs))
    return entry[1]


def _resolve(url: str, scorer: str | None, client: RewardClient) -> tuple[str, str]:
    """(scorer name, its kind), from one cached `GET /v1/scorers` per service."""
    if scorer is not None and (url, scorer) in _kinds:
        return scorer, _kinds[(url, scorer)]
    if scorer is None and url in _default_scorer:
        return _default_scorer[url], _kinds[(url, _default_scorer[url])]
    listed = client.scorers()
    kinds = {s["name"]: s.get("kind", "") for s in listed}
    if scorer is None:
        scorer = _default_scorer[url] = pick_scorer(listed, url)
    if scorer not in kinds:
        raise UsageError(f"the service at {url} has no scorer {scorer!r} (it has {sorted(kinds)})")
    with _lock:
        _kinds.update({(url, name): kind for name, kind in kinds.items()})
    return scorer, kinds[scorer]


def _prompt(extra_info: Any, kind: str, scorer: str, where: str) -> str | list[dict[str, str]]:
    if isinstance(extra_info, Mapping):
        for key in PROMPT_KEYS:
            value = extra_info.get(key)
            if value is not None and (not isinstance(value, str | list | tuple) or len(value) > 0):
                if hasattr(value, "tolist"):
                    value = value.tolist()
                return as_turns(value, f"{where}.extra_info[{key!r}]")
    if kind in PROMPTLESS_KINDS:
        return ""
    raise UsageError(
        f"{where}: scorer {scorer!r} ({kind}) scores the prompt too, but verl passes only the response: "
        f"store the prompt in extra_info['prompt'] or extra_info['question'] when preparing the data "
        f"(docs/integrations.md)"
    )


def _items(
    scorer: str,
    kind: str,
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Any],
    data_sources: Sequence[Any] | None = None,
) -> list[dict[str, Any]]:
    items = []
    for i, (response, truth, info) in enumerate(zip(solution_strs, ground_truths, extra_infos, strict=True)):
        item: dict[str, Any] = {
            "id": str(i),
            "prompt": _prompt(info, kind, scorer, f"sample {i}"),
            "response": str(response),
        }
        if meta := _audit_metadata(info, data_sources[i] if data_sources is not None else None):
            item["metadata"] = meta
        reference = as_reference(truth)
        if reference is not None:
            item["reference"] = reference
        items.append(item)
    return items


def _audit_metadata(extra_info: Any, data_source: Any) -> dict[str, Any]:
    """What the service's audit reads (docs/audit.md): the policy version — verl 0.9's reward
    loop merges the rollout server's `extra_fields` into `extra_info`, among them
    `global_steps`, the step of the weights that generated the response — and the data source."""
    meta: dict[str, Any] = {}
    step = extra_info.get("global_steps") if isinstance(extra_info, Mapping) else None
    if hasattr(step, "item"):
        step = step.item()
    if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
        meta["policy_version"] = step
    if isinstance(data_source, str) and data_source:
        meta["data_source"] = data_source
    return meta


def _values(results: list[ItemScores], scorer: str) -> list[float]:
    values, failures = split_results(results, scorer)
    raise_failures(failures, results)
    return [float(v) for v in values if v is not None]


def compute_score_batch(
    data_sources: Sequence[Any],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Any] | None = None,
    **kwargs: Any,
) -> list[float]:
    """One reward per response, scored by the service; any failure raises (never 0.0)."""
    url, scorer, _, client_kwargs, batch_size = _settings(kwargs)
    client = _client(url, client_kwargs)
    scorer, kind = _resolve(url, scorer, client)
    n = len(solution_strs)
    infos = list(extra_infos) if extra_infos is not None else [None] * n
    truths = list(ground_truths) if ground_truths is not None else [None] * n
    if not (len(data_sources) == len(truths) == len(infos) == n):
        raise UsageError(
            f"compute_score_batch: {len(data_sources)} data_sources, {n} solution_strs, "
            f"{len(truths)} ground_truths, {len(infos)} extra_infos"
        )
    items = _items(scorer, kind, solution_strs, truths, infos, data_sources)
    results: list[ItemScores] = []
    for start in range(0, len(items), batch_size):
        results.extend(client.score(items[start : start + batch_size], [scorer]))
    return _values(results, scorer)


def compute_score(
    data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> float:
    """The service's score for one response (the naive reward manager's call); failures raise."""
    return compute_score_batch([data_source], [solution_str], [ground_truth], [extra_info], **kwargs)[0]


async def compute_score_async(
    data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> float:
    """`compute_score` as a coroutine, for verl's reward-loop managers (no thread per sample)."""
    url, scorer, _, client_kwargs, _ = _settings(kwargs)
    if scorer is None or (url, scorer) not in _kinds:  # the one-time look-up, off the event loop
        scorer, _kind = await asyncio.to_thread(_resolve, url, scorer, _client(url, client_kwargs))
    kind = _kinds[(url, scorer)]
    items = _items(scorer, kind, [solution_str], [ground_truth], [extra_info], [data_source])
    results = await _async_client(url, client_kwargs).score(items, [scorer])
    return _values(results, scorer)[0]
