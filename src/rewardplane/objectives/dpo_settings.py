"""The `dpo:` config section: `DPOSettings` (with `dpo.reference`, `ReferenceSettings`) and the
checks on a DPO config as written (`check_written`, the registry's hook).

Plain pydantic, no torch: `rewardplane train dpo` reads and checks its whole config, this section
included, before the objective (`rewardplane.objectives.dpo`) and torch are imported, so an
unknown key or a bad value is answered at once. docs/dpo.md lists every key.
"""

from __future__ import annotations

import math
from typing import Any, Literal, get_args

from pydantic import ConfigDict, Field, model_validator

from rewardplane.core.config import ConfigModel, Dtype
from rewardplane.core.errors import ConfigError

DPOLossType = Literal["sigmoid", "ipo", "hinge", "robust", "reference_free"]
DPO_LOSS_TYPES: tuple[str, ...] = get_args(DPOLossType)
"""`dpo.loss_type`: the DPO family `rewardplane.objectives.losses.dpo_loss` computes."""

REFERENCE_SOURCES = ("initial_policy", "snapshot")


class ReferenceSettings(ConfigModel):
    """`dpo.reference`: where the frozen reference comes from.

    `initial_policy` (default) snapshots the policy at step 0; `snapshot` loads a pinned local
    Hugging Face snapshot (`repo`, full 40-hex `revision`, `path`, optional `cache_dir`) after
    verifying its provenance (`rewardplane.models.reference`).
    """

    model_config = ConfigDict(frozen=True)

    source: str = "initial_policy"
    repo: str | None = None
    revision: str | None = None
    path: str | None = None
    cache_dir: str | None = None

    @model_validator(mode="after")
    def _check(self) -> ReferenceSettings:
        if self.source not in REFERENCE_SOURCES:
            raise ConfigError(f"dpo.reference.source must be one of {', '.join(REFERENCE_SOURCES)}")
        if self.source == "snapshot":
            missing = [k for k in ("repo", "revision", "path") if not getattr(self, k)]
            if missing:
                raise ConfigError(f"dpo.reference.source: snapshot needs {', '.join(missing)}")
        elif any((self.repo, self.revision, self.path, self.cache_dir)):
            raise ConfigError("dpo.reference.repo/revision/path/cache_dir only apply to source: snapshot")
        return self


REFERENCE_DTYPES = ("fp32", "bf16")


class DPOSettings(ConfigModel):
    """The `dpo:` config section (see docs/dpo.md for every key and why it defaults as it does).

    The checks raise `ConfigError` themselves (not `ValueError`): their messages name the
    `dpo.` keys they relate, which the loader passes through unchanged.
    """

    model_config = ConfigDict(frozen=True)

    loss_type: str = "sigmoid"
    beta: float = 0.1
    label_smoothing: float = 0.0
    temperature: float = 1.0
    allow_dropout: bool = False
    precompute_reference: bool = False
    reference_batch_size: int | None = Field(None, ge=1)  # None: the training micro-batch (docs/dpo.md)
    reference_dtype: Dtype = "fp32"  # bf16 halves the frozen reference's weights
    reference_cache_dir: str | None = None
    reference: ReferenceSettings = Field(default_factory=ReferenceSettings)

    @model_validator(mode="after")
    def _check(self) -> DPOSettings:
        if self.loss_type not in DPO_LOSS_TYPES:
            raise ConfigError(
                f"dpo.loss_type must be one of {', '.join(DPO_LOSS_TYPES)}, got {self.loss_type!r}"
            )
        if not (math.isfinite(self.beta) and self.beta > 0):
            raise ConfigError(f"dpo.beta must be a finite number > 0, got {self.beta!r}")
        if not 0 <= self.label_smoothing < 0.5:
            raise ConfigError(f"dpo.label_smoothing must be in [0, 0.5), got {self.label_smoothing!r}")
        if self.label_smoothing and self.loss_type not in ("sigmoid", "robust", "reference_free"):
            raise ConfigError(f"dpo.label_smoothing has no meaning for loss_type {self.loss_type!r}")
        # DPO's likelihood is the policy's own distribution: dividing logits by a temperature
        # changes π and π_ref differently once π moves, and the implicit reward loses its meaning.
        if not math.isfinite(self.temperature):
            raise ConfigError(f"dpo.temperature must be finite, got {self.temperature!r}")
        if self.temperature != 1.0:
            raise ConfigError(
                f"dpo.temperature={self.temperature}: DPO log-probs are taken at temperature 1; "
                "a sampling temperature does not apply to preference training"
            )
        if self.reference_dtype not in REFERENCE_DTYPES:
            raise ConfigError(
                f"dpo.reference_dtype must be one of {', '.join(REFERENCE_DTYPES)}, got {self.reference_dtype!r}"
            )
        if self.loss_type == "reference_free" and self.precompute_reference:
            raise ConfigError("dpo.precompute_reference has no reference to precompute with reference_free")
        return self

    @property
    def average_logps(self) -> bool:
        return self.loss_type == "ipo"

    @property
    def needs_reference(self) -> bool:
        return self.loss_type != "reference_free"

    def to_json(self) -> dict[str, Any]:
        return self.model_dump()


def check_written(data: dict[str, Any]) -> None:
    """The checks on a DPO config as written, before defaults fill it in (the registry's
    `check_written`): LoRA needs a stated reference strategy."""
    check_lora(data.get("model"), data.get("dpo"))


def check_lora(model_section: Any, dpo_section: Any) -> None:
    """Refuse LoRA without an explicit reference strategy.

    With adapters the natural reference is the base model with adapters disabled
    (`source: initial_policy`), but a pinned SFT snapshot is just as common; a default would
    silently pick one, so the strategy must be stated.
    """
    if not isinstance(model_section, dict) or model_section.get("lora") is None:
        return
    reference = (dpo_section or {}).get("reference") if isinstance(dpo_section, dict) else None
    if not isinstance(reference, dict) or "source" not in reference:
        raise ConfigError(
            "model.lora is set but dpo.reference.source is not: LoRA needs an explicit reference strategy"
            " (initial_policy: the frozen base with adapters disabled; snapshot: a pinned model)"
        )
