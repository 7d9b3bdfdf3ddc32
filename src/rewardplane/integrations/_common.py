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


def split_results(results: list[ItemScores], scorer: str) -> tuple[list[float | None], list[ItemFailure]]:
    """Each item's score (None where it failed) and the failures, checked once more for finiteness."""
    values: list[float | None] = []
    failures: list[ItemFailure] = []
    for r in results:
        value = r.scores.get(scorer)
        if scorer in r.errors:
            err = r.errors[scorer]
            failures.append(ItemFailure(r.id, scorer, str(err.get("code")), str(err.get("message", ""))))
            values.append(None)
        elif value is None or not math.isfinite(value):
            failures.append(ItemFailure(r.id, scorer, "non_finite", f"the service answered {value!r}"))
            values.append(None)
        else:
            values.append(float(value))
    return values, failures


def raise_failures(failures: list[ItemFailure], results: list[ItemScores]) -> None:
    if failures:
        raise ScoreError(failures, results)
