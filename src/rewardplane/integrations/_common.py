"""Helpers shared by the trainer adapters: settings from the environment, chat-message rows,
the items they send and the failures they raise."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from rewardplane.core.errors import UsageError
from rewardplane.serve.client import ItemFailure, ItemScores, ScoreError

ITEM_KIND = "item"
"""`ItemFailure.kind` of a failure the item caused (docs/serve.md "Failure kinds")."""


def setting(value: str | None, env: str, *, required: bool = False, what: str = "") -> str | None:
    """`value` if given, else the environment variable `env`; missing and `required` is a UsageError."""
    if value is None or value == "":
        value = os.environ.get(env) or None
    if value is None and required:
        raise UsageError(f"no rewardplane {what or env} given: pass it or set {env}")
    return value


def pick_scorer(scorers: list[dict[str, Any]], url: str) -> str:
    """The service's only scorer; with several, the caller must name one."""
    names = [s["name"] for s in scorers]
    if len(names) != 1:
        raise UsageError(f"the service at {url} hosts {len(names)} scorers {names}: name one with scorer=")
    return names[0]


def as_reference(value: Any) -> Any:
    """A trainer's ground truth as an item's `reference`: text as is, a number as its text (what
    `exact_match` compares), a list or mapping as JSON (for verifier scorers), numpy unwrapped."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return str(value)
    return json.loads(json.dumps(value, default=str))


def _text_content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for block in content:
            if isinstance(block, Mapping) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            else:
                kind = block.get("type") if isinstance(block, Mapping) else type(block).__name__
                raise UsageError(f"{where}: a {kind!r} content block cannot be sent to a text scorer")
        return "".join(parts)
    raise UsageError(f"{where}: message content must be text, got {type(content).__name__}")


def as_turns(value: Any, where: str) -> str | list[dict[str, str]]:
    """A prompt or response as the service takes it: a string, or `{role, content}` messages with
    text content (extra keys such as `tool_calls` are dropped; text blocks are joined)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):  # a single message
        value = [value]
    if isinstance(value, Sequence):
        out = []
        for n, message in enumerate(value):
            if not isinstance(message, Mapping) or "role" not in message:
                raise UsageError(f"{where}[{n}]: expected a {{'role', 'content'}} message")
            out.append(
                {"role": str(message["role"]), "content": _text_content(message.get("content"), where)}
            )
        return out
    raise UsageError(f"{where}: expected a string or a list of messages, got {type(value).__name__}")


def score_item(
    item_id: str, prompt: Any, response: Any, reference: Any = None, metadata: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One `POST /v1/score` item; a trainer's ground truth, when there is one, as its `reference`,
    and what the service's audit reads (`policy_version`, `data_source`) as its `metadata`."""
    item: dict[str, Any] = {"id": item_id, "prompt": prompt, "response": response}
    reference = as_reference(reference)
    if reference is not None:
        item["reference"] = reference
    if metadata:
        item["metadata"] = metadata
    return item


def _score_of(result: ItemScores, scorer: str) -> float | dict[str, str]:
    """An item's score from `scorer`, or why there is none as `{"code", "message"}`."""
    if scorer in result.errors:
        return result.errors[scorer]
    value = result.scores.get(scorer)
    if value is None or not math.isfinite(value):
        return {"code": "non_finite", "message": f"the service answered {value!r}"}
    return float(value)


def split_results(
    results: list[ItemScores],
    scorer: str,
    component: str | None = None,
    *,
    item_penalty: float | None = None,
) -> tuple[list[float | None], list[ItemFailure], list[ItemFailure]]:
    """Each item's score (None where it failed), the failures, and the failures penalised:
    checked once more for finiteness, the scorer's own, or with `component` one of a composite
    scorer's components (`ItemScores.component`: an error where the composite failed the item or
    left it out). A component's failures are named `<scorer>.<component>`. With `item_penalty`,
    a failure of the item's own kind (`ItemFailure.kind == "item"`: the policy's doing) gets that
    value instead and is listed apart; a service failure stays a failure (mask or retry)."""
    label = scorer if component is None else f"{scorer}.{component}"
    values: list[float | None] = []
    failures: list[ItemFailure] = []
    penalised: list[ItemFailure] = []
    for r in results:
        value = _score_of(r, scorer) if component is None else r.component(scorer, component)
        if isinstance(value, dict):
            code, message = str(value.get("code")), str(value.get("message", ""))
            failure = ItemFailure(r.id, label, code, message, str(value.get("kind", "")))
            if item_penalty is not None and failure.kind == ITEM_KIND:
                penalised.append(failure)
                values.append(float(item_penalty))
                continue
            failures.append(failure)
            values.append(None)
        else:
            values.append(float(value))
    return values, failures, penalised


def check_penalty(item_penalty: float | None) -> float | None:
    """`item_penalty` as a finite float (a reward), or None; anything else is a UsageError."""
    if item_penalty is None:
        return None
    if (
        isinstance(item_penalty, bool)
        or not isinstance(item_penalty, int | float)
        or not math.isfinite(item_penalty)
    ):
        raise UsageError(f"item_penalty must be a finite number or None, got {item_penalty!r}")
    return float(item_penalty)


def composite_components(listed: list[dict[str, Any]], name: str, url: str) -> list[dict[str, Any]]:
    """The components (`{name, weight, ...}`) of composite scorer `name`, from `GET /v1/scorers`;
    a UsageError for a scorer the service does not host or one that is not a composite."""
    entry = next((s for s in listed if s.get("name") == name), None)
    if entry is None:
        raise UsageError(
            f"the service at {url} has no scorer {name!r} (it has {[s['name'] for s in listed]})"
        )
    components = (entry.get("extra") or {}).get("components")
    if entry.get("kind") != "composite" or not isinstance(components, list):
        raise UsageError(
            f"scorer {name!r} at {url} is a {entry.get('kind')!r}, not a composite: it has no components"
        )
    return components


def raise_failures(failures: list[ItemFailure], results: list[ItemScores]) -> None:
    if failures:
        raise ScoreError(failures, results)
