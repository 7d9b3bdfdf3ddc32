"""The normalised records every other part of rewardplane consumes.

Readers accept many public shapes (explicit prompt, implicit prompt, UltraFeedback, HH-RLHF,
TRL); all of them normalise to `PreferencePair`. Tokenisation turns a pair into a
`TokenizedPair`, which is what training, evaluation and probes hash and batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Message = dict[str, str]
"""A chat message: {"role": "system"|"user"|"assistant", "content": str}."""


@dataclass(frozen=True)
class PreferencePair:
    """One validated chosen/rejected comparison.

    `prompt` is the shared conversation prefix (possibly empty for plain-text rows);
    `chosen` and `rejected` are the assistant turn(s) that follow it.

    `plain_text` marks a row whose prompt and completions were all plain strings (TRL's
    "standard" format): TRL tokenises those as text plus EOS, not through the chat template,
    so tokenisation must know. Its messages hold the strings (a user turn, unless the prompt is
    empty, and one assistant turn per side), and `to_json` writes the strings back, so a
    normalised record re-reads as the same pair.
    """

    pair_id: str
    prompt: list[Message]
    chosen: list[Message]
    rejected: list[Message]
    margin: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    plain_text: bool = False

    @property
    def subset(self) -> str | None:
        subset = self.metadata.get("subset")
        return subset if isinstance(subset, str) else None

    def texts(self) -> tuple[str, str, str]:
        """(prompt, chosen, rejected) strings of a `plain_text` pair."""
        if not self.plain_text:
            raise ValueError(f"pair {self.pair_id!r} is a conversation, not plain text")
        prompt = self.prompt[0]["content"] if self.prompt else ""
        return prompt, self.chosen[0]["content"], self.rejected[0]["content"]

    def to_json(self) -> dict[str, Any]:
        prompt, chosen, rejected = (
            self.texts() if self.plain_text else (self.prompt, self.chosen, self.rejected)
        )
        return {
            "pair_id": self.pair_id,
            "prompt": prompt,
            "chosen": chosen,
            "rejected": rejected,
            "margin": self.margin,
            "metadata": self.metadata,
        }


@dataclass(frozen=True)
class TokenizedBranch:
    """Token ids of prompt + one completion, as the model sees them.

    `loss_mask[i] == 1` marks completion tokens (DPO log-probs sum over them);
    `score_index` is the position of the last completion token, where a reward model reads
    its score.
    """

    input_ids: list[int]
    loss_mask: list[int]
    score_index: int

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass(frozen=True)
class TokenizedPair:
    pair_id: str
    chosen: TokenizedBranch
    rejected: TokenizedBranch
    margin: float | None = None
    subset: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.chosen) + len(self.rejected)
