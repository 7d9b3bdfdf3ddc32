"""Training configuration: the reward-model and DPO config models, read through the one loader.

One resolved config is written to `RUN/config.yaml`, so a run can always be reproduced from
its own directory. Reading, overrides, unknown keys and type errors are `rewardplane.core.config`'s
(docs/config.md): a typo must not silently fall back to a default.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator

from rewardplane.core.config import (
    ConfigModel,
    apply_overrides,
    canonical_dtype,
    dump_yaml,
    load,
    parse,
    read_config_data,
    to_dict,
)
from rewardplane.data.tokenize import DEFAULT_MAX_COMPLETION_LENGTH, DEFAULT_MAX_LENGTH
from rewardplane.objectives.dpo import DPOSettings, check_lora

__all__ = [
    "DPOTrainConfig",
    "DataConfig",
    "LoraConfig",
    "LossConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "SynthConfig",
    "TrainConfig",
    "apply_overrides",
    "dump_yaml",
    "from_dict",
    "load_config",
    "load_dpo_config",
    "read_config_data",
    "to_dict",
]

from_dict = parse
"""`from_dict(TrainConfig, {...})`: the loader's `parse`, under the name tests and benchmarks use."""


def _precision(value: Any) -> Any:
    """`run.precision`: auto, or a dtype spelling that training supports (fp16 autocast is not)."""
    if value == "auto":
        return value
    try:
        dtype = canonical_dtype(value)
    except ValueError:
        dtype = None
    if dtype not in ("fp32", "bf16"):
        raise ValueError(f"must be auto, fp32 or bf16 (or float32, bfloat16), got {value!r}")
    return dtype


Precision = Annotated[str, BeforeValidator(_precision)]


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


class SynthConfig(ConfigModel):
    train_rows: int = 2000
    eval_rows: int = 200
    seed: int = 0


class DataConfig(ConfigModel):
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


class OptimConfig(ConfigModel):
    lr: float = 1e-4
    weight_decay: float = 0.0
    betas: list[float] = Field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    schedule: Literal["cosine", "constant"] = "cosine"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    max_grad_norm: float | None = 1.0


class LossConfig(ConfigModel):
    center_rewards_coefficient: float = 0.0
    use_margin: bool = True  # subtract a pair's `margin` inside the sigmoid (Llama-2 style)


class RunConfig(ConfigModel):
    run_dir: str = "runs/rm"
    seed: int = 0
    max_steps: int = 100
    global_batch_pairs: int = 32
    grad_accum: int = 1
    layout: Literal["right", "left", "packed"] = "packed"
    parallel: Literal["ddp", "fsdp2"] = "ddp"
    precision: Precision = "auto"  # auto: bf16 autocast on CUDA, fp32 on CPU
    save_every: int = 0  # 0: only at the end
    keep_last: int = 2
    eval_every: int = 0  # 0: only at step 0 and the end
    eval_batch_size: int = 32
    tensorboard: bool = False  # the same as report_to: [tensorboard]
    # experiment trackers: trackio | wandb | tensorboard | none (rewardplane.train.tracking)
    report_to: Annotated[
        list[Literal["trackio", "wandb", "tensorboard", "none"]],
        BeforeValidator(lambda v: [v] if isinstance(v, str) else v),
    ] = Field(default_factory=list)
    progress: bool = True
    progress_every_s: float = 30.0  # without a terminal: one progress line this often
    num_threads: int | None = None
    # torch.compile each transformer block (regional: one graph reused by every layer). Fuses the
    # norm / rotary / activation elementwise work that dominates small models in eager mode.
    compile: bool = False


class TrainConfig(ConfigModel):
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    run: RunConfig = Field(default_factory=RunConfig)


class DPOTrainConfig(TrainConfig):
    """The reward-model config plus a `dpo:` section (docs/dpo.md)."""

    dpo: DPOSettings = Field(default_factory=DPOSettings)


def load_config(path: str | Path | None, overrides: Sequence[str] = (), cls: type = TrainConfig) -> Any:
    return load(cls, path, overrides)


def load_dpo_config(path: str | Path | None, overrides: Sequence[str] = ()) -> DPOTrainConfig:
    data = read_config_data(path, overrides)
    check_lora(data.get("model"), data.get("dpo"))  # needs what was written, not the defaults
    return parse(DPOTrainConfig, data)
