"""Training configuration: the sections every objective shares (`model`, `data`, `optim`, `run`),
and each objective's config derived from the objective registry (`config_model`: the shared
sections plus the objective's own, e.g. `dpo:`), read through the one loader.

One resolved config is written to `RUN/config.yaml`, so a run can always be reproduced from
its own directory. Reading, overrides, unknown keys and type errors are `rewardplane.core.config`'s
(docs/config.md): a typo must not silently fall back to a default.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, create_model

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
from rewardplane.data.config import DataConfig, SynthConfig
from rewardplane.models.config import LoraConfig, ModelConfig
from rewardplane.objectives import registry

__all__ = [
    "BaseTrainConfig",
    "DPOTrainConfig",
    "DataConfig",
    "LossConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "SynthConfig",
    "TrainConfig",
    "apply_overrides",
    "config_model",
    "dump_yaml",
    "from_dict",
    "load_config",
    "load_dpo_config",
    "load_objective_config",
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


class OptimConfig(ConfigModel):
    lr: float = 1e-4
    weight_decay: float = 0.0
    betas: list[float] = Field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    schedule: Literal["cosine", "constant"] = "cosine"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    max_grad_norm: float | None = 1.0


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


class BaseTrainConfig(ConfigModel):
    """The sections every objective's config shares; `config_model` adds the objective's own."""

    objective: ClassVar[str]
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    run: RunConfig = Field(default_factory=RunConfig)


@functools.cache
def config_model(objective: str) -> type[BaseTrainConfig]:
    """The training config of `objective`: the shared sections plus its own (`section:` in the
    objective registry, validated by its `settings` model)."""
    spec = registry.spec(objective)
    settings = spec.resolve("settings")
    model = create_model(
        f"{settings.__name__.removesuffix('Settings')}TrainConfig",
        __base__=BaseTrainConfig,
        __module__=__name__,
        **{spec.section: (settings, Field(default_factory=settings))},
    )
    model.objective = objective
    return model


TrainConfig = config_model("reward_model")  # `rewardplane train rm`'s config
DPOTrainConfig = config_model("dpo")  # the shared sections plus `dpo:` (docs/dpo.md)
LossConfig = registry.spec("reward_model").resolve("settings")  # the RM's `loss:` section


def load_objective_config(
    objective: str, path: str | Path | None, overrides: Sequence[str] = ()
) -> BaseTrainConfig:
    """`objective`'s config from a YAML file and dotted overrides, then its checks on what was
    written (a default cannot tell "not given" from "given as the default"). Every section's
    model is torch-free (an objective's settings live in `objectives/<name>_settings.py`), so
    a missing file, an unknown key or a bad value is answered before torch is imported."""
    data = read_config_data(path, overrides)
    config = parse(config_model(objective), data)
    spec = registry.spec(objective)
    if spec.check_written is not None:
        spec.resolve("check_written")(data)
    return config


def load_config(path: str | Path | None, overrides: Sequence[str] = (), cls: type | None = None) -> Any:
    """`cls` (default: the reward model's `TrainConfig`) from a YAML file and dotted overrides."""
    return load(cls or config_model("reward_model"), path, overrides)


def load_dpo_config(path: str | Path | None, overrides: Sequence[str] = ()) -> BaseTrainConfig:
    return load_objective_config("dpo", path, overrides)
