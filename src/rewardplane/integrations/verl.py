"""verl `custom_reward_function`s backed by a rewardplane service (tested with verl 0.9.1;
docs/integrations.md).

```
reward.custom_reward_function.path=pkg://rewardplane.integrations.verl
reward.custom_reward_function.name=compute_score_async
+reward.custom_reward_function.reward_kwargs.url=http://127.0.0.1:8000
+reward.custom_reward_function.reward_kwargs.scorer=rm
```

verl 0.9 computes rewards in its Reward Loop: `RewardLoopWorker.compute_score` (called per
trajectory by the agent loop as its generation ends, or per sample of a chunk by
`RewardLoopManager.compute_rm_score`) hands one sample to the reward manager's `run_single`
(`naive` by default), which calls the custom function:

- `compute_score_async(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float`:
  a coroutine, which the manager awaits on the worker's event loop (`inspect.iscoroutinefunction`),
  so all of a worker's samples are in flight at once on one connection pool; the service
  batches them.
- `compute_score(...)`: the same, blocking; the manager runs it in the worker's thread pool, one
  call per sample.

A composite scorer's answer is a dict (verl's extra reward info): `{"score": total,
"<component>": value, ...}`, each component's raw score before the composite aggregates it. The
manager keeps `score` as the reward and every key in `reward_extra_info`, which verl gathers
into the batch under the key's name: what its GDPO advantage reads
(`algorithm.adv_estimator=gdpo`, `algorithm.gdpo_reward_keys=[<component>, ...]`, weights in
`algorithm.gdpo_reward_weights`) and what it logs. verl stacks each key over the samples, so
every answer carries every component: one without a number (the composite failed the item, or
left the component out under `on_failure: renormalize`) raises `ScoreError` instead. Set
`+reward.custom_reward_function.reward_kwargs.components=false` for the total alone (a float).

verl passes only the response (`solution_str`, decoded with special tokens stripped), never the
prompt. The prompt is read from `extra_info["prompt"]`, else `extra_info["question"]` (verl's
data-preparation scripts store the question there): a string, or `{role, content}` messages. A
scorer that needs a prompt (every kind except the rule scorers `exact_match`, `regex`, `length`)
raises `UsageError` when neither is there. `ground_truth` is sent as the item's `reference`.

Settings: `url`, `scorer`, `token` (and `timeout`, `max_retries`, `components`) from verl's `reward_kwargs`,
else `REWARDPLANE_URL` / `REWARDPLANE_SCORER` / `REWARDPLANE_TOKEN`; with no scorer the service
must host exactly one. Other keyword arguments verl adds are ignored.

A failed score raises, after the client's retries: `ScoreError` for an item error,
`ServiceError` for a whole-request failure (no answer: `connection_failed` / `client_timeout`;
the service's answer: `unauthorized`, `unknown_scorer`, ...). It is never 0.0. Beware verl's
`rate_limited` reward manager, which turns any exception into a reward of 0.0.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

from rewardplane.core.errors import UsageError
from rewardplane.integrations import _common as common
from rewardplane.serve.client import AsyncRewardClient, ItemScores, RewardClient, ServiceError

# Scorer kinds that read only the response (and `reference`); every other kind needs the prompt.
PROMPTLESS_KINDS = frozenset({"exact_match", "regex", "length"})
PROMPT_KEYS = ("prompt", "question")
UNKNOWN_SCORER_STATUS = 422
"""What `POST /v1/score` answers for a scorer it does not host (`unknown_scorer`)."""

_lock = threading.Lock()
_clients: dict[tuple, RewardClient] = {}
_async_clients: dict[tuple, tuple[asyncio.AbstractEventLoop, AsyncRewardClient]] = {}
_kinds: dict[tuple[str, str], str] = {}
_components: dict[tuple[str, str], tuple[str, ...]] = {}
_default_scorer: dict[str, str] = {}
TOTAL = "score"
"""The key of the total in a composite's answer, verl's reward (`result["score"]`)."""


def _settings(kwargs: Mapping[str, Any]) -> tuple[str, str | None, dict[str, Any]]:
    url = common.setting(kwargs.get("url"), "REWARDPLANE_URL", required=True, what="URL").rstrip("/")
    scorer = common.setting(kwargs.get("scorer"), "REWARDPLANE_SCORER")
    client_kwargs = {"token": common.setting(kwargs.get("token"), "REWARDPLANE_TOKEN"), "allow_partial": True}
    for key in ("timeout", "max_retries"):
        if kwargs.get(key) is not None:
            client_kwargs[key] = kwargs[key]
    return url, scorer, client_kwargs


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
        scorer = _default_scorer[url] = common.pick_scorer(listed, url)
    if scorer not in kinds:
        raise ServiceError(
            UNKNOWN_SCORER_STATUS,
            "unknown_scorer",
            f"the service at {url} has no scorer {scorer!r} (it has {sorted(kinds)})",
        )
    with _lock:
        _kinds.update({(url, name): kind for name, kind in kinds.items()})
        for entry in listed:
            if entry.get("kind") == "composite":
                names = (c.get("name") for c in (entry.get("extra") or {}).get("components", ()))
                _components[(url, entry["name"])] = tuple(str(n) for n in names)
    return scorer, kinds[scorer]


def _prompt(extra_info: Any, kind: str, scorer: str) -> str | list[dict[str, str]]:
    if isinstance(extra_info, Mapping):
        for key in PROMPT_KEYS:
            value = extra_info.get(key)
            if value is not None and (not isinstance(value, str | list | tuple) or len(value) > 0):
                if hasattr(value, "tolist"):
                    value = value.tolist()
                return common.as_turns(value, f"extra_info[{key!r}]")
    if kind in PROMPTLESS_KINDS:
        return ""
    raise UsageError(
        f"scorer {scorer!r} ({kind}) scores the prompt too, but verl passes only the response: "
        f"store the prompt in extra_info['prompt'] or extra_info['question'] when preparing the data "
        f"(docs/integrations.md)"
    )


def _item(
    scorer: str, kind: str, solution_str: str, ground_truth: Any, extra_info: Any, data_source: Any = None
) -> dict[str, Any]:
    prompt = _prompt(extra_info, kind, scorer)
    metadata = _audit_metadata(extra_info, data_source)
    return common.score_item("0", prompt, str(solution_str), ground_truth, metadata)


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


def _answer(
    results: list[ItemScores], url: str, scorer: str, kwargs: Mapping[str, Any]
) -> float | dict[str, float]:
    """The item's score, or for a composite (unless `components=false`) `{"score": total,
    <component>: value, ...}`; any failure, a component's included, raises `ScoreError`."""
    penalty = common.check_penalty(kwargs.get("item_penalty"))
    values, failures, _ = common.split_results(results, scorer, item_penalty=penalty)
    components = _components.get((url, scorer), ()) if kwargs.get("components", True) else ()
    parts = {c: common.split_results(results, scorer, c, item_penalty=penalty) for c in components}
    common.raise_failures(failures + [f for _, fails, _ in parts.values() for f in fails], results)
    if not components:
        return float(values[0])  # type: ignore[arg-type]
    return {TOTAL: float(values[0]), **{c: float(v[0]) for c, (v, _, _) in parts.items()}}  # type: ignore[arg-type]


def compute_score(
    data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> float | dict[str, float]:
    """The service's score for one response (the reward loop runs it in a thread), a dict with
    the components for a composite; failures raise."""
    url, scorer, client_kwargs = _settings(kwargs)
    client = _client(url, client_kwargs)
    scorer, kind = _resolve(url, scorer, client)
    item = _item(scorer, kind, solution_str, ground_truth, extra_info, data_source)
    return _answer(client.score([item], [scorer]), url, scorer, kwargs)


async def compute_score_async(
    data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> float | dict[str, float]:
    """`compute_score` as a coroutine: verl's Reward Loop awaits it (no thread per sample)."""
    url, scorer, client_kwargs = _settings(kwargs)
    if scorer is None or (url, scorer) not in _kinds:  # the one-time look-up, off the event loop
        scorer, _kind = await asyncio.to_thread(_resolve, url, scorer, _client(url, client_kwargs))
    item = _item(scorer, _kinds[(url, scorer)], solution_str, ground_truth, extra_info, data_source)
    return _answer(await _async_client(url, client_kwargs).score([item], [scorer]), url, scorer, kwargs)
