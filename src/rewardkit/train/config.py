"""Training configuration: dataclasses, YAML files and `key=value` overrides.

One resolved config is written to `RUN/config.yaml`, so a run can always be reproduced from
its own directory. Unknown keys and wrongly typed values are refused up front with the
dotted key in the message (a typo must not silently fall back to a default).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from rewardkit.core.errors import ConfigError


@dataclass
class LoraConfig:
    """`model.lora`: train low-rank adapters on a frozen base instead of every parameter (peft).

    Only DPO policies take adapters, and only with an explicit `dpo.reference.source`
    (docs/dpo.md). `alpha / r` scales the update; `target_modules` is peft's: a list of module
    names or "all-linear" (every linear layer but the output head).
    """

    r: int = 16
    alpha: float = 32.0
    dropout: float = 0.0  # > 0 makes the policy's log-probs stochastic: refused unless dpo.allow_dropout
    target_modules: list[str] | str = "all-linear"

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ConfigError(f"model.lora.r must be >= 1, got {self.r}")
        if not self.alpha > 0:
            raise ConfigError(f"model.lora.alpha must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"model.lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ConfigError("model.lora.target_modules must name at least one module")

    @property
    def scaling(self) -> float:
        return self.alpha / self.r


@dataclass
class ModelConfig:
    """Backbone source: exactly one of `tiny`, `config` (inline dict with model_type) or `path`."""

    tiny: str | None = None
    config: dict[str, Any] | None = None
    path: str | None = None
    gguf_file: str | None = None
    init_from: str | None = None  # rewardkit RM checkpoint or HF *ForSequenceClassification dir
    config_overrides: dict[str, Any] = field(default_factory=dict)
    attn_implementation: str = "auto"  # rk_varlen on CUDA, sdpa on CPU (models/attention.py)
    trust_remote_code: bool = False
    gradient_checkpointing: bool = False
    lora: LoraConfig | None = None


@dataclass
class SynthConfig:
    train_rows: int = 2000
    eval_rows: int = 200
    seed: int = 0


@dataclass
class DataConfig:
    train: str | None = None  # JSONL / Parquet preference file
    eval: str | None = None  # held-out preference file
    probe: str | None = None  # frozen probe directory (rewardkit data freeze-probe)
    synth: SynthConfig | None = None  # rewardkit's synthetic task instead of files
    tokenizer: str = "builtin"  # "builtin", "model" (the backbone's own) or a local tokenizer directory
    max_length: int = 512
    max_completion_length: int = 256
    truncation: Literal["drop", "truncate"] = "drop"


@dataclass
class OptimConfig:
    lr: float = 1e-4
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    schedule: Literal["cosine", "constant"] = "cosine"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    max_grad_norm: float | None = 1.0


@dataclass
class LossConfig:
    center_rewards_coefficient: float = 0.0
    use_margin: bool = True  # subtract a pair's `margin` inside the sigmoid (Llama-2 style)


@dataclass
class RunConfig:
    run_dir: str = "runs/rm"
    seed: int = 0
    max_steps: int = 100
    global_batch_pairs: int = 32
    grad_accum: int = 1
    layout: Literal["right", "left", "packed"] = "packed"
    parallel: Literal["ddp", "fsdp2"] = "ddp"
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 autocast on CUDA, fp32 on CPU
    save_every: int = 0  # 0: only at the end
    keep_last: int = 2
    eval_every: int = 0  # 0: only at step 0 and the end
    eval_batch_size: int = 32
    tensorboard: bool = False
    progress: bool = True
    num_threads: int | None = None
    # torch.compile each transformer block (regional: one graph reused by every layer). Fuses the
    # norm / rotary / activation elementwise work that dominates small models in eager mode.
    compile: bool = False


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    run: RunConfig = field(default_factory=RunConfig)


def _check_type(value: Any, hint: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _check_type(value, arg, key)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0]
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, key)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, str):
        # PyYAML (YAML 1.1) reads `1e-4` without a dot as a string.
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"{key}: expected float, got {value!r}") from None
    base = origin or hint
    if base is Any:
        return value
    if not isinstance(value, base) or (base is int and isinstance(value, bool)):
        raise ConfigError(f"{key}: expected {getattr(base, '__name__', base)}, got {value!r}")
    return value


def from_dict(cls: type, data: Any, prefix: str = "") -> Any:
    """Build dataclass `cls` from a nested dict, refusing unknown keys and wrong types."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(f"unknown config key(s): {', '.join(where + k for k in unknown)}")
    kwargs = {k: _check_type(v, hints[k], f"{prefix}.{k}" if prefix else k) for k, v in data.items()}
    return cls(**kwargs)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` strings; values are parsed as YAML scalars (`1e-4`, `true`, `null`)."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not key=value")
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {key}: {part} is not a section")
            node = child
        node[parts[-1]] = yaml.safe_load(raw) if raw else ""
    return data


def read_config_data(path: str | Path | None, overrides: list[str] = ()) -> dict[str, Any]:
    """The YAML file (if any) with overrides applied, before validation."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: invalid YAML ({exc})") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
    return apply_overrides(data, list(overrides))


def load_config(path: str | Path | None, overrides: list[str] = (), cls: type = TrainConfig) -> Any:
    return from_dict(cls, read_config_data(path, overrides))


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def dump_yaml(config: Any) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)
