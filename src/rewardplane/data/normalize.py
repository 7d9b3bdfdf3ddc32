"""Turn one decoded row, in any accepted shape, into a `PreferencePair` or a `Rejection`.

Accepted shapes (see docs/data.md for examples):

- explicit prompt: `prompt` (string or message list) with `chosen` / `rejected` (string or
  message list of the assistant turn(s)). A message-list side that repeats the prompt first
  (UltraFeedback-binarized) has that prefix removed, and must match it exactly;
- implicit prompt: `chosen` and `rejected` full conversations; the prompt is their strictly
  shared message prefix and each side continues with exactly one assistant message.
  HH-RLHF transcripts (`\\n\\nHuman:` / `\\n\\nAssistant:` strings) are parsed into messages
  first; two plain strings with no prompt are TRL's "standard implicit" rows, split into prompt
  and completions at their longest common prefix exactly as TRL's `maybe_extract_prompt` does;
- rows whose prompt (if any), chosen and rejected are all plain strings, HH transcripts aside,
  are TRL's "standard" rows and marked `plain_text`: tokenisation gives them TRL's text + EOS
  instead of the chat template (`rewardplane.data.tokenize`);
- optional `pair_id` / `id` / `prompt_id`, `margin` (finite number) and `metadata` (object);
  UltraFeedback's `score_chosen` / `score_rejected` are kept in metadata.

A JSON `null` counts as absent everywhere (Parquet has no other way to say "missing"). Nothing
is repaired: every check raises a `Rejection` carrying its reason code.
"""

from __future__ import annotations

import math
import re
from typing import Any

from rewardplane.core.hashing import canonical_json, sha256_bytes
from rewardplane.data import reasons as R
from rewardplane.data.reasons import Rejection
from rewardplane.data.records import Message, PreferencePair

ROLES = frozenset({"system", "user", "assistant"})
ID_KEYS = ("pair_id", "id", "prompt_id")
SCORE_KEYS = ("score_chosen", "score_rejected")

_ONLY_STR = {str}
_HH_TURN = re.compile(r"\n\n(Human|Assistant):")
_HH_ROLE = {"Human": "user", "Assistant": "assistant"}


def normalize_row(row: Any) -> PreferencePair:
    """Validate and normalise one row; raise `Rejection` (reason attached) when it is bad."""
    if not isinstance(row, dict):
        raise Rejection(R.SCHEMA, f"row is {_a(_type_name(row))} JSON {_type_name(row)}, not an object")
    row = {key: value for key, value in row.items() if value is not None}
    pair_id = _read_id(row)
    try:
        return _normalize(row, pair_id)
    except Rejection as rejection:
        rejection.pair_id = pair_id
        raise


def derive_pair_id(
    prompt: list[Message], chosen: list[Message], rejected: list[Message], margin, metadata
) -> str:
    """SHA-256 of the canonical normalised content: same row (in any input format) → same id."""
    content = {
        "prompt": prompt,
        "chosen": chosen,
        "rejected": rejected,
        "margin": margin,
        "metadata": metadata,
    }
    return sha256_bytes(canonical_json(content))


def _normalize(row: dict[str, Any], pair_id: str | None) -> PreferencePair:
    if "chosen" not in row and "completion" in row and "label" in row:
        raise Rejection(R.SCHEMA, "unpaired preference row (completion/label) is not a chosen/rejected pair")
    for key in ("chosen", "rejected"):
        if key not in row:
            raise Rejection(R.MISSING_FIELD, f"missing field {key!r}")
    margin = _read_margin(row)
    metadata = _read_metadata(row)
    if "prompt" in row:
        prompt = _read_prompt(row["prompt"])
        chosen = _explicit_completion(row["chosen"], prompt, "chosen")
        rejected = _explicit_completion(row["rejected"], prompt, "rejected")
        plain_text = all(isinstance(row[key], str) for key in ("prompt", "chosen", "rejected"))
    else:
        prompt, chosen, rejected = _implicit(row["chosen"], row["rejected"])
        plain_text = isinstance(row["chosen"], str) and not _is_hh(row["chosen"])
    for side, messages in (("chosen", chosen), ("rejected", rejected)):
        if not any(m["content"].strip() for m in messages):
            raise Rejection(R.EMPTY_COMPLETION, f"{side} completion is empty")
    if chosen == rejected:
        raise Rejection(R.IDENTICAL, "chosen and rejected are identical")
    if pair_id is None:
        pair_id = derive_pair_id(prompt, chosen, rejected, margin, metadata)
    # the id does not depend on `plain_text`: ids (hence splits and probes) stay those of
    # rewardplane before plain-text rows were tokenised as TRL does
    return PreferencePair(pair_id, prompt, chosen, rejected, margin, metadata, plain_text)


def _read_id(row: dict[str, Any]) -> str | None:
    for key in ID_KEYS:
        if key not in row:
            continue
        value = row[key]
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise Rejection(R.SCHEMA, f"{key} must be a string or integer, got {_type_name(value)}")
        value = str(value)
        if not value:
            raise Rejection(R.SCHEMA, f"{key} is an empty string")
        return value
    return None


def _read_margin(row: dict[str, Any]) -> float | None:
    if "margin" not in row:
        return None
    value = row["margin"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Rejection(R.SCHEMA, f"margin must be a number, got {_type_name(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise Rejection(R.NON_FINITE_MARGIN, f"margin is {value}")
    return value


def _read_metadata(row: dict[str, Any]) -> dict[str, Any]:
    metadata = row.get("metadata", {})
    if not isinstance(metadata, dict):
        raise Rejection(R.SCHEMA, f"metadata must be an object, got {_type_name(metadata)}")
    metadata = dict(metadata)
    for key in SCORE_KEYS:
        if key in row:
            metadata.setdefault(key, row[key])
    if metadata and set(map(type, metadata.values())) != _ONLY_STR:
        try:  # anything but flat string metadata: make sure it is plain, finite JSON
            canonical_json(metadata)
        except (TypeError, ValueError) as exc:
            raise Rejection(R.SCHEMA, f"metadata is not plain finite JSON: {exc}") from None
    return metadata


def _read_prompt(value: Any) -> list[Message]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}] if value else []
    return _read_messages(value, "prompt")


def _explicit_completion(value: Any, prompt: list[Message], side: str) -> list[Message]:
    if isinstance(value, str):
        return [{"role": "assistant", "content": value}]
    messages = _read_messages(value, side)
    if prompt and len(messages) > len(prompt) and messages[: len(prompt)] == prompt:
        messages = messages[len(prompt) :]  # UltraFeedback: the side repeats the prompt first
    elif prompt and messages and messages[0]["role"] != "assistant":
        raise Rejection(R.PROMPT_MISMATCH, f"{side} conversation does not start with the prompt")
    for message in messages:
        if message["role"] != "assistant":
            raise Rejection(
                R.BAD_ROLE, f"{side} completion has a {message['role']!r} turn; only assistant turns"
            )
    return messages


def _implicit(chosen: Any, rejected: Any) -> tuple[list[Message], list[Message], list[Message]]:
    if isinstance(chosen, str) and isinstance(rejected, str):
        hh_chosen, hh_rejected = _is_hh(chosen), _is_hh(rejected)
        if hh_chosen != hh_rejected:
            raise Rejection(R.SCHEMA, "one side is an HH-RLHF transcript and the other is not")
        if not hh_chosen:  # TRL standard implicit row: the shared text prefix is the prompt
            prompt, chosen_text, rejected_text = extract_text_prompt(chosen, rejected)
            return (
                [{"role": "user", "content": prompt}] if prompt else [],
                [{"role": "assistant", "content": chosen_text}],
                [{"role": "assistant", "content": rejected_text}],
            )
        chosen_messages, rejected_messages = _parse_hh(chosen, "chosen"), _parse_hh(rejected, "rejected")
    elif isinstance(chosen, str) or isinstance(rejected, str):
        raise Rejection(
            R.SCHEMA, "without a prompt, chosen and rejected must both be strings or both conversations"
        )
    else:
        chosen_messages, rejected_messages = (
            _read_messages(chosen, "chosen"),
            _read_messages(rejected, "rejected"),
        )
    shared = 0
    for a, b in zip(chosen_messages, rejected_messages, strict=False):
        if a != b:
            break
        shared += 1
    if len(chosen_messages) == len(rejected_messages) == shared:
        raise Rejection(R.IDENTICAL, "chosen and rejected conversations are identical")
    if len(chosen_messages) != shared + 1 or len(rejected_messages) != shared + 1:
        raise Rejection(
            R.PROMPT_MISMATCH,
            f"conversations diverge at message {shared}; each side must continue the shared prefix "
            f"with exactly one assistant message (chosen has {len(chosen_messages) - shared}, "
            f"rejected {len(rejected_messages) - shared} messages after it)",
        )
    for side, last in (("chosen", chosen_messages[-1]), ("rejected", rejected_messages[-1])):
        if last["role"] != "assistant":
            raise Rejection(
                R.BAD_ROLE, f"{side} continues the prompt with a {last['role']!r} turn, not assistant"
            )
    return chosen_messages[:shared], chosen_messages[shared:], rejected_messages[shared:]


def extract_text_prompt(chosen: str, rejected: str) -> tuple[str, str, str]:
    """(prompt, chosen, rejected) split as TRL's `extract_prompt` splits two strings.

    The prompt is the longest common prefix; when the first differing character follows a
    space, that space goes to the completions (`"The sky is blue."` / `"The sky is green."` →
    `"The sky is"`, `" blue."`, `" green."`). As in TRL, when one string is a prefix of the
    other the last shared character stays with the completions.
    """
    shortest = min(len(chosen), len(rejected))
    idx = 0
    for idx in range(shortest):
        if chosen[idx] != rejected[idx]:
            if idx > 0 and chosen[idx - 1] == " ":
                idx -= 1
            break
    return chosen[:idx], chosen[idx:], rejected[idx:]


def _read_messages(value: Any, field: str) -> list[Message]:
    if not isinstance(value, list):
        raise Rejection(R.SCHEMA, f"{field} must be a string or a list of messages, got {_type_name(value)}")
    messages: list[Message] = []
    for position, message in enumerate(value):
        # fast path for well-formed messages; the slow path below names the problem
        if type(message) is dict:
            role, content = message.get("role"), message.get("content")
            if type(role) is str and role in ROLES and type(content) is str:
                messages.append(message if len(message) == 2 else {"role": role, "content": content})
                continue
        _raise_for_message(message, f"{field}[{position}]")
    return messages


def _raise_for_message(message: Any, where: str) -> None:
    if not isinstance(message, dict):
        raise Rejection(
            R.SCHEMA, f"{where} is {_a(_type_name(message))} {_type_name(message)}, not a message object"
        )
    for key in ("role", "content"):
        if message.get(key) is None:
            raise Rejection(R.MISSING_FIELD, f"{where} has no {key!r}")
    role, content = message["role"], message["content"]
    if not isinstance(role, str) or role not in ROLES:
        raise Rejection(R.BAD_ROLE, f"{where} has role {role!r}; expected system, user or assistant")
    raise Rejection(
        R.NON_TEXT_CONTENT, f"{where} content is {_a(_type_name(content))} {_type_name(content)}, not text"
    )


def _is_hh(text: str) -> bool:
    return text.lstrip().startswith("Human:") or text.startswith("\n\nHuman:")


def _parse_hh(text: str, field: str) -> list[Message]:
    """Split an HH-RLHF transcript into messages (turn text stripped of surrounding spaces)."""
    if not text.startswith("\n\n"):
        text = "\n\n" + text.lstrip()
    parts = _HH_TURN.split(text)
    if parts[0].strip():
        raise Rejection(R.SCHEMA, f"{field} transcript has text before the first Human: turn")
    return [
        {"role": _HH_ROLE[speaker], "content": body.strip()}
        for speaker, body in zip(parts[1::2], parts[2::2], strict=True)
    ]


def _a(noun: str) -> str:
    """The article before `noun` ("an array", "a string")."""
    return "an" if noun[:1] in "aeiou" else "a"


def _type_name(value: Any) -> str:
    return {
        dict: "object",
        list: "array",
        str: "string",
        bool: "boolean",
        int: "number",
        float: "number",
        type(None): "null",
    }.get(type(value), type(value).__name__)
