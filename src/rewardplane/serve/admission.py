"""The admission contract: what an item must be before any scorer sees it (docs/serve.md
"Admission").

One check for every scorer kind, driven by what the kind declares (`Scorer.reads`: the item
fields its score depends on; `Scorer.empty_response`: its policy for an empty response), so a
kind cannot forget a line of the contract and a new kind gets it for free:

1. a missing response (absent or null on the wire) is `bad_input` for a scorer that reads
   responses;
2. text that cannot be encoded is `bad_input`, for every scorer (the item is malformed, whatever
   the scorer reads): a lone UTF-16 surrogate in the prompt or the response (message roles and
   contents included), or in a string `reference` the scorer reads; a prompt or response that is
   an empty message list;
3. an empty or whitespace-only response gets the scorer's `empty_response` policy: `error`
   (`bad_input`), `score` (the scorer scores it as given: a rule defines "", e.g. length 0) or a
   number (that fixed reward, never reaching a batch).

A scorer that declares it reads nothing (a composite, whose components admit for themselves)
is not checked here.

Who runs it: the batcher, on the admission threads before `Scorer.prepare` (every request of
every route, in-process or in a deploy worker), a composite for each of its inline components
(`scorers/composite.py`, so each component applies its own policy and the composite's
`on_failure` decides), and a Ray Serve replica before its batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rewardplane.serve.protocol import ItemError, ScoreItem

PROMPT, RESPONSE, REFERENCE, IMAGE = "prompt", "response", "reference", "image"
FIELDS = frozenset({PROMPT, RESPONSE, REFERENCE, IMAGE})
"""What `Scorer.reads` may name."""

Admitted = ItemError | float | None
"""An admission answer: refused (`ItemError`), answered without scoring (a fixed reward), or
admitted (None)."""


CHECK_CHUNK = 1 << 20
"""Characters encoded per step when checking text: the GIL can pass between steps, so a
near-limit response admitted in a thread never holds the event loop for the whole check."""


def _valid_text(text: str) -> bool:
    """Whether `text` is valid Unicode (no lone UTF-16 surrogate): what UTF-8 can encode. A
    Python string holds code points, so a surrogate pair cannot straddle two chunks."""
    if text.isascii():
        return True
    try:
        for start in range(0, len(text), CHECK_CHUNK):
            text[start : start + CHECK_CHUNK].encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text_problem(value: Any, name: str) -> str | None:
    """Why a prompt or response cannot be encoded, or None."""
    if isinstance(value, str):
        return None if _valid_text(value) else f"{name} is not valid Unicode (a lone UTF-16 surrogate)"
    if isinstance(value, list):
        if not value:
            return f"{name} is an empty message list"
        for n, message in enumerate(value):
            texts = (message.get("role"), message.get("content")) if isinstance(message, dict) else ()
            if any(isinstance(t, str) and not _valid_text(t) for t in texts):
                return f"{name}[{n}] is not valid Unicode (a lone UTF-16 surrogate)"
    return None


def _blank(text: str) -> bool:
    """Empty or whitespace only, without copying the text (`strip` would)."""
    return not text or text.isspace()


def _is_empty(response: Any) -> bool:
    if isinstance(response, str):
        return _blank(response)
    return all(_blank(str(m.get("content") or "")) for m in response if isinstance(m, dict))


def admit(item: ScoreItem, reads: frozenset[str], empty_response: str | float) -> Admitted:
    """One item against the contract for a scorer that reads `reads` with policy `empty_response`."""
    if RESPONSE in reads and item.response is None:
        return ItemError("bad_input", "missing response")
    for name in (PROMPT, RESPONSE):
        if problem := _text_problem(getattr(item, name), name):
            return ItemError("bad_input", problem)
    ref = item.reference
    if REFERENCE in reads and isinstance(ref, str) and not _valid_text(ref):
        return ItemError("bad_input", "reference is not valid Unicode (a lone UTF-16 surrogate)")
    if RESPONSE in reads and empty_response != "score" and _is_empty(item.response):
        if empty_response == "error":
            return ItemError("bad_input", "empty response (the scorer's empty_response policy is 'error')")
        return float(empty_response)
    return None


def admit_many(scorer: Any, items: Sequence[ScoreItem]) -> list[Admitted]:
    """`admit` for each item, by what `scorer` declares."""
    reads, empty = scorer.reads, scorer.empty_response
    if not reads:
        return [None] * len(items)
    return [admit(item, reads, empty) for item in items]


def admitted(
    scorer: Any,
    items: list[ScoreItem],
    run: Callable[[list[ScoreItem]], list[Any]],
    fixed: Callable[[float], Any] = float,
) -> list[Any]:
    """`run` on the items `scorer` admits, one answer per item in order: a refused item's
    `ItemError`, `fixed(reward)` for an item answered with its `empty_response` reward, or
    `run`'s answer. `run` is not called when no item is admitted."""
    answers = admit_many(scorer, items)
    todo = [item for item, a in zip(items, answers, strict=True) if a is None]
    done = run(todo) if todo else []
    if len(done) != len(todo):
        raise RuntimeError(f"scorer returned {len(done)} values for {len(todo)} items")
    it = iter(done)
    return [next(it) if a is None else a if isinstance(a, ItemError) else fixed(a) for a in answers]
