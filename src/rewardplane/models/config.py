"""The `model:` config section: which backbone a run builds or loads, and its LoRA adapters.

It sits with the models it describes, below the objectives that read it (typed, not `Any`), and
the training config (`rewardplane.train.config`) composes it with the other sections.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import Field, field_validator

from rewardplane.core.config import ConfigModel


class LoraConfig(ConfigModel):
    """`model.lora`: train low-rank adapters on a frozen base instead of every parameter (peft).

    Only DPO policies take adapters, and only with an explicit `dpo.reference.source`
    (docs/dpo.md). `alpha / r` scales the update; `target_modules` is peft's: a list of module
    names or "all-linear" (every linear layer but the output head).
    """

    r: int = Field(16, ge=1)
    alpha: float = Field(32.0, gt=0)
    # > 0 makes the policy's log-probs stochastic: refused unless dpo.allow_dropout
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] | str = "all-linear"

    @field_validator("target_modules")
    @classmethod
    def _names_a_module(cls, value: list[str] | str) -> list[str] | str:
        if not value:
            raise ValueError("must name at least one module")
        return value

    @property
    def scaling(self) -> float:
        return self.alpha / self.r


class ModelConfig(ConfigModel):
    """Backbone source: exactly one of `tiny`, `config` (inline dict with model_type) or `path`."""

    tiny: str | None = None
    config: dict[str, Any] | None = None
    path: str | None = None
    gguf_file: str | None = None
    random_init: bool = False  # with `path`: its architecture, fresh weights (the baseline for pretraining)
    init_from: str | None = None  # rewardplane RM checkpoint or HF *ForSequenceClassification dir
    config_overrides: dict[str, Any] = Field(default_factory=dict)
    attn_implementation: str = "auto"  # rk_varlen on CUDA, sdpa on CPU (models/attention.py)
    trust_remote_code: bool = False
    gradient_checkpointing: bool = False
    lora: LoraConfig | None = None

    @field_validator("tiny")
    @classmethod
    def _known_tiny(cls, value: str | None) -> str | None:
        from rewardplane.models.tiny import TINY_CONFIGS

        if value is not None and value not in TINY_CONFIGS:
            close = difflib.get_close_matches(value, list(TINY_CONFIGS), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(f"must be one of {', '.join(sorted(TINY_CONFIGS))}, got {value!r}{hint}")
        return value
