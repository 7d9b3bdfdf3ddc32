"""LoRA adapters on a frozen causal-LM base (peft), and what checkpoints need from them.

With adapters the frozen base *is* the natural DPO reference: `adapters_disabled(model)` runs
the base alone, so no second copy of the weights is held (TRL does the same with
`peft_config` and no `ref_model`). A checkpoint holds the adapters twice over, in two forms
that each have a reader:

- `model.safetensors`: the merged plain causal LM (W + (α/r)·B·A per adapted linear), so
  `rewardplane export hf`, evaluation and serving read a LoRA run like a full one;
- `adapter/adapter_model.safetensors` + `adapter/adapter_config.json`: peft's own format, from
  which a resume restores the adapters exactly (merging is not invertible in floating point)
  and which `PeftModel.from_pretrained(base, checkpoint / "adapter")` reads. They sit in a
  subdirectory because transformers' `from_pretrained` treats a directory holding
  `adapter_config.json` as an adapter and would apply it on top of the merged weights.

The merge is done here on the CPU copy of the state dict that checkpointing already makes,
not with peft's in-place `merge_adapter`/`unmerge_adapter`, whose round trip would perturb the
frozen base (and with it the reference) by rounding.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rewardplane.core.errors import ConfigError

ADAPTER_DIR = "adapter"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
PEFT_PREFIX = "base_model.model."
ADAPTER_NAME = "default"
_ADAPTER_SUFFIXES = (f".lora_A.{ADAPTER_NAME}.weight", f".lora_B.{ADAPTER_NAME}.weight")
BASE_LOADER = "peft.disable_adapter"
"""Appended to the reference sidecar's loader when the reference is a LoRA policy's own base."""


def _peft():
    try:
        import peft
    except ImportError:
        raise ConfigError("model.lora needs peft: pip install 'rewardplane[lora]'") from None
    return peft


def apply_lora(policy: nn.Module, lora: Any) -> nn.Module:
    """The policy wrapped with fresh adapters (B = 0, so it computes exactly the base at step 0)."""
    peft = _peft()
    config = peft.LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        model = peft.get_peft_model(policy, config)
    except ValueError as exc:  # e.g. target_modules that name nothing in this architecture
        raise ConfigError(f"model.lora: {exc}") from None
    # checkpoints merge linear adapters only: refuse others now, not at the first save
    other = [n for n in model.state_dict() if ".lora_" in n and not n.endswith(_ADAPTER_SUFFIXES)]
    if other:
        raise ConfigError(f"model.lora.target_modules: only linear layers take adapters here, not {other[0]}")
    return model


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Run the frozen base alone: the reference of a LoRA policy whose source is itself."""
    with getattr(model, "module", model).disable_adapter():
        yield


def merged_state_dict(state: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """A peft LoRA state dict as the plain model's state dict, adapters merged into the weights.

    `<m>.base_layer.weight` + scaling · `<m>.lora_B.default.weight` @ `<m>.lora_A.default.weight`
    becomes `<m>.weight` (in float64, cast back), `<m>.base_layer.bias` becomes `<m>.bias`, and the
    `base_model.model.` prefix is dropped.
    """
    out: dict[str, torch.Tensor] = {}
    a_suffix, b_suffix = _ADAPTER_SUFFIXES
    for name, value in state.items():
        if not name.startswith(PEFT_PREFIX):
            raise ValueError(f"{name}: not a peft state dict entry")
        plain = name[len(PEFT_PREFIX) :]
        if ".lora_" in plain:
            if not plain.endswith(_ADAPTER_SUFFIXES):
                raise ValueError(f"{name}: only plain LoRA on linear layers can be merged")
            continue
        if ".base_layer." in plain:
            module, _, leaf = plain.partition(".base_layer.")
            if leaf == "weight":
                a = state[PEFT_PREFIX + module + a_suffix].double()
                b = state[PEFT_PREFIX + module + b_suffix].double()
                value = (value.double() + scaling * (b @ a)).to(value.dtype)
            plain = f"{module}.{leaf}"
        out[plain] = value
    return out


def write_adapter(directory: Path, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """peft's adapter files under `directory/adapter/`, from a full state dict (the checkpoint's CPU copy)."""
    from safetensors.torch import save_file

    peft = _peft()
    inner = getattr(model, "module", model)
    adapter = peft.get_peft_model_state_dict(inner, state_dict=state)
    out = directory / ADAPTER_DIR
    out.mkdir()
    save_file({k: v.contiguous() for k, v in adapter.items()}, str(out / ADAPTER_WEIGHTS))
    inner.peft_config[ADAPTER_NAME].save_pretrained(str(out))


def load_adapter(model: nn.Module, directory: Path) -> None:
    """Restore a checkpoint's adapters into `model` (whose base is already the run's base).

    Called after the objective's `validate_resume`, which compares the recorded `model.lora`."""
    from safetensors.torch import load_file

    from rewardplane.models.loading import CheckpointError

    adapter_dir = Path(directory) / ADAPTER_DIR
    path = adapter_dir / ADAPTER_WEIGHTS
    if not path.is_file() or not (adapter_dir / ADAPTER_CONFIG).is_file():
        raise CheckpointError(
            f"{directory}: a LoRA run resumes from {ADAPTER_DIR}/{ADAPTER_WEIGHTS} and {ADAPTER_CONFIG}, which are missing",
            code="missing_state",
        )
    # different adapter settings were refused before this, from the checkpoint's `lora` metadata
    inner = getattr(model, "module", model)
    device = next(inner.parameters()).device
    result = _peft().set_peft_model_state_dict(inner, load_file(str(path), device=str(device)))
    if getattr(result, "unexpected_keys", None):
        raise CheckpointError(
            f"{directory}: adapter weights this model does not have: {result.unexpected_keys[:3]}"
        )
