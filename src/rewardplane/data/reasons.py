"""The fixed, public list of reason codes for rejected preference rows.

A rejection carries its code from the place it is raised (`Rejection(reason, ...)`), so
reports, manifests and tests never recover a reason by matching message text. The list is
part of the stable interface: codes are only ever added, never renamed.
"""

from __future__ import annotations

from typing import Any

from rewardplane.core.errors import RewardplaneError

SCHEMA = "schema"
MISSING_FIELD = "missing_field"
BAD_ROLE = "bad_role"
NON_TEXT_CONTENT = "non_text_content"
EMPTY_COMPLETION = "empty_completion"
IDENTICAL = "identical"
PROMPT_MISMATCH = "prompt_mismatch"
DUPLICATE_ID = "duplicate_id"
NON_FINITE_MARGIN = "non_finite_margin"
OVERSIZE = "oversize"
POST_TRUNCATION = "post_truncation"

REASONS: tuple[str, ...] = (
    SCHEMA,
    MISSING_FIELD,
    BAD_ROLE,
    NON_TEXT_CONTENT,
    EMPTY_COMPLETION,
    IDENTICAL,
    PROMPT_MISMATCH,
    DUPLICATE_ID,
    NON_FINITE_MARGIN,
    OVERSIZE,
    POST_TRUNCATION,
)
"""Every reason code, in the order summaries and manifests list them."""

DESCRIPTIONS: dict[str, str] = {
    SCHEMA: "not a JSON object, a field of the wrong type, or no known preference format",
    MISSING_FIELD: "a required field (chosen, rejected, a message's role or content) is absent",
    BAD_ROLE: "a role outside system/user/assistant, or a completion turn that is not the assistant's",
    NON_TEXT_CONTENT: "message content that is not a string (images, content-part lists, numbers)",
    EMPTY_COMPLETION: "a chosen or rejected completion that is empty or whitespace only",
    IDENTICAL: "chosen and rejected are the same (as text, or as token ids)",
    PROMPT_MISMATCH: "chosen and rejected do not share the prompt, or do not end in one assistant turn each",
    DUPLICATE_ID: "the pair id was already used by an earlier row (the first occurrence is kept)",
    NON_FINITE_MARGIN: "margin is NaN or infinite",
    OVERSIZE: "longer than max_length / max_completion_length (drop) or still too long after truncation",
    POST_TRUNCATION: "chosen and rejected became identical after truncation",
}


class Rejection(RewardplaneError):
    """One rejected row: `reason` is one of `REASONS`, `message` says what was wrong.

    Raised by normalisation and tokenisation; readers yield it in place of the pair so the
    caller sees every row, valid or not, in input order.
    """

    def __init__(
        self,
        reason: str,
        message: str,
        *,
        source_index: int | None = None,
        pair_id: str | None = None,
    ) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown reason code {reason!r}")
        super().__init__(message, code=reason)
        self.reason = reason
        self.source_index = source_index
        self.pair_id = pair_id

    def at(self, source_index: int, pair_id: str | None = None) -> Rejection:
        """The same rejection located in the input (row index and, when known, pair id)."""
        self.source_index = source_index
        if pair_id is not None and self.pair_id is None:
            self.pair_id = pair_id
        return self

    def to_json(self) -> dict[str, Any]:
        return {
            "source_index": self.source_index,
            "pair_id": self.pair_id,
            "reason": self.reason,
            "message": self.message,
        }

    def __repr__(self) -> str:
        return f"Rejection({self.reason!r}, {self.message!r}, source_index={self.source_index!r})"


def empty_counts() -> dict[str, int]:
    """A per-reason counter with every code present, so summaries have a stable shape."""
    return dict.fromkeys(REASONS, 0)
