"""verl `custom_reward_function`s backed by a rewardplane service (tested with verl 0.9.1;
configuration, GDPO components and failures for users: docs/integrations.md, "verl").

What the code below keeps to, and why:
- verl's reward manager calls `compute_score_async` (awaited on the worker's event loop, so a
  worker's samples are in flight together and the service batches them) or `compute_score`
  (blocking, in the worker's thread pool), one sample per call.
- Settings come from `reward_kwargs` (`url`, `scorer`, `token`, `timeout`, `max_retries`,
  `components`), else `REWARDPLANE_URL` / `REWARDPLANE_SCORER` / `REWARDPLANE_TOKEN`; verl's
  other keyword arguments are ignored. One `GET /v1/scorers` per service, cached, resolves the
  scorer's kind, whether it reads the prompt (`reads`) and a composite's components.
- verl passes only the response: the prompt comes from `extra_info["prompt"]`, else
  `extra_info["question"]`; a scorer whose score reads the prompt refuses to run without one.
- A composite answers `{"score": total, <component>: value, ...}` (every component, else
  `ScoreError`: verl stacks each key over the samples).
- A failure raises (`ScoreError`, `ServiceError`), never 0.0; verl's `rate_limited` manager
  would turn it into 0.0, hence the warning in the docs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

from rewardplane.core.errors import UsageError
from rewardplane.integrations import _common as common
from rewardplane.serve.client import AsyncRewardClient, ItemScores, RewardClient, ServiceError

PROMPT_KEYS = ("prompt", "question")
UNKNOWN_SCORER_STATUS = 422
"""What `POST /v1/score` answers for a scorer it does not host (`unknown_scorer`)."""

_lock = threading.Lock()
_clients: dict[tuple, RewardClient] = {}
_async_clients: dict[tuple, tuple[asyncio.AbstractEventLoop, AsyncRewardClient]] = {}
_kinds: dict[tuple[str, str], tuple[str, bool]] = {}
"""(url, scorer) -> (its kind, whether its score reads the prompt: `reads` in `GET /v1/scorers`)."""
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


def _resolve(url: str, scorer: str | None, client: RewardClient) -> tuple[str, tuple[str, bool]]:
    """(scorer name, (its kind, whether it reads the prompt)), from one cached
    `GET /v1/scorers` per service. A scorer that does not say what it reads needs the prompt."""
    if scorer is not None and (url, scorer) in _kinds:
        return scorer, _kinds[(url, scorer)]
    if scorer is None and url in _default_scorer:
        return _default_scorer[url], _kinds[(url, _default_scorer[url])]
    listed = client.scorers()
    kinds = {s["name"]: (s.get("kind", ""), s.get("reads") is None or "prompt" in s["reads"]) for s in listed}
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


def _prompt(extra_info: Any, kind: tuple[str, bool], scorer: str) -> str | list[dict[str, str]]:
    if isinstance(extra_info, Mapping):
        for key in PROMPT_KEYS:
            value = extra_info.get(key)
            if value is not None and (not isinstance(value, str | list | tuple) or len(value) > 0):
                if hasattr(value, "tolist"):
                    value = value.tolist()
                return common.as_turns(value, f"extra_info[{key!r}]")
    if not kind[1]:  # the service says this scorer's score does not read the prompt
        return ""
    raise UsageError(
        f"scorer {scorer!r} ({kind[0]}) scores the prompt too, but verl passes only the response: "
        f"store the prompt in extra_info['prompt'] or extra_info['question'] when preparing the data "
        f"(docs/integrations.md)"
    )


def _item(
    scorer: str,
    kind: tuple[str, bool],
    solution_str: str,
    ground_truth: Any,
    extra_info: Any,
    data_source: Any = None,
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
