"""The `data:` config section: where a run's pairs come from and how they are tokenised.

It sits with the data pipeline it configures, below the objectives that read it (typed, not
`Any`); the training config (`rewardplane.train.config`) composes it with the other sections.
"""

from __future__ import annotations

from typing import Literal

from rewardplane.core.config import ConfigModel
from rewardplane.data.tokenize import DEFAULT_MAX_COMPLETION_LENGTH, DEFAULT_MAX_LENGTH


class SynthConfig(ConfigModel):
    train_rows: int = 2000
    eval_rows: int = 200
    seed: int = 0


class DataConfig(ConfigModel):
    # a folder written by `rewardplane data prepare`: its train.jsonl / eval.jsonl, checked against
    # its manifest (file hashes, tokenizer, length settings); instead of train / eval / synth
    prepared: str | None = None
    train: str | None = None  # JSONL / Parquet preference file
    eval: str | None = None  # held-out preference file
    probe: str | None = None  # frozen probe directory (rewardplane data freeze-probe)
    synth: SynthConfig | None = None  # rewardplane's synthetic task instead of files
    tokenizer: str = "builtin"  # "builtin", "model" (the backbone's own) or a local tokenizer directory
    max_length: int = DEFAULT_MAX_LENGTH  # one default with `rewardplane data` (rewardplane.data.tokenize)
    max_completion_length: int = DEFAULT_MAX_COMPLETION_LENGTH
    truncation: Literal["drop", "truncate"] = "drop"
    # template_end: the last token of apply_chat_template(conversation), as TRL / RewardBench read
    # it; end_of_turn: rewardplane's reading before issue 24 (to continue such a run)
    score_position: Literal["template_end", "end_of_turn"] = "template_end"
    # plain-string rows (TRL "standard"): text_eos, the text + EOS without a chat template, as TRL
    # tokenises them; chat_template: as user/assistant turns, rewardplane before issue 24
    plain_text: Literal["text_eos", "chat_template"] = "text_eos"
    # TRL's RewardConfig.pad_token: a vocabulary token to pad with (saved with the tokenizer, hence
    # in checkpoints and exports); needed where pad == EOS is the token scores are read at
    pad_token: str | None = None
