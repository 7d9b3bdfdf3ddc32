"""Training checkpoints: `RUN/checkpoints/step-NNNNNNN/`, written atomically, last K kept.

Layout of one checkpoint directory:

- `model.safetensors`, `config.json`, tokenizer files: the model as `load_reward_model` reads it
- `rewardplane.json`: metadata (format version, objective, role, head, base-model identity,
  tokenizer/template hashes, step, pairs consumed, data manifest hash, weights hash, and
  `weight_files`: size and SHA-256 of every weight file, checked before every load)
- `optimizer.pt`: full (unsharded) optimizer state keyed by parameter name
- `trainer_state.json`: scheduler, sampler position, step-0 evaluation identity
- `rng.pt`: python / numpy / torch / cuda RNG states of every rank
- `training_data.npz`: content keys of every training pair (`rewardplane.data.overlap`), so an
  evaluation can count the evaluated pairs the model was trained on

The whole directory is staged in a temp sibling and renamed into place, so a crash during a
save leaves the previous checkpoint intact and the half-written one invisible (its temp name
never matches `step-NNNNNNN`).
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rewardplane.core.atomic import staged_dir
from rewardplane.models.loading import (
    FORMAT_VERSION,
    METADATA_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    file_digests,
    is_checkpoint,
    read_metadata,
    verify_files,
)
from rewardplane.train.distributed import DistInfo, all_gather_objects, barrier

STEP_RE = re.compile(r"^step-(\d{7})$")
REQUIRED_STATE = ("optimizer.pt", "trainer_state.json", "rng.pt")


def step_dir_name(step: int) -> str:
    return f"step-{step:07d}"


def list_checkpoints(checkpoints_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first (a complete one always has its metadata file)."""
    root = Path(checkpoints_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if STEP_RE.match(p.name) and is_checkpoint(p)]
    return sorted(found, key=lambda p: int(STEP_RE.match(p.name).group(1)))


def latest_checkpoint(checkpoints_dir: str | Path) -> Path | None:
    found = list_checkpoints(checkpoints_dir)
    return found[-1] if found else None


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def full_state_dicts(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Unsharded model and optimizer state (FSDP2 / DDP / plain alike), complete on rank 0."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_state_dict(model, optimizer, options=options)


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """Load the unsharded optimizer state, keyed by the (already loaded) model's parameter names."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    optim_state = torch.load(directory / "optimizer.pt", map_location="cpu", weights_only=True)
    set_optimizer_state_dict(model, optimizer, optim_state, options=StateDictOptions(full_state_dict=True))


def save_checkpoint(
    run_dir: str | Path,
    *,
    step: int,
    info: DistInfo,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    write_model: Any,
    metadata: dict[str, Any],
    trainer_state: dict[str, Any],
    keep_last: int,
    files: dict[str, bytes] | None = None,
) -> Path | None:
    """Collective: every rank must call it. Rank 0 writes; returns the directory on rank 0.

    `write_model(directory, state_dict) -> weights_sha256` writes the objective's model files;
    `files` are written beside them (the training-data record, `rewardplane.data.overlap`).
    """
    model_state, optim_state = full_state_dicts(model, optimizer)
    rng_states = all_gather_objects(rng_state())
    final = Path(run_dir) / "checkpoints" / step_dir_name(step)
    if info.is_main:
        with staged_dir(final) as tmp:
            weights_sha = write_model(tmp, model_state)
            for name, data in (files or {}).items():
                (tmp / name).write_bytes(data)
            torch.save(optim_state, tmp / "optimizer.pt")
            torch.save({"ranks": rng_states}, tmp / "rng.pt")
            (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2, sort_keys=True))
            meta = {**metadata, "format_version": FORMAT_VERSION, "step": step, "model_sha256": weights_sha}
            # size + SHA-256 of every weight file: every load checks them (models.loading.verify_files)
            meta["weight_files"] = file_digests(tmp)
            if WEIGHTS_FILE in meta["weight_files"]:
                meta["weight_files"][WEIGHTS_FILE]["sha256"] = weights_sha
            meta["world_size"] = info.world_size
            # Metadata last: a directory without it is never treated as a checkpoint.
            (tmp / METADATA_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))
        _prune(final.parent, keep_last)
    barrier()
    return final if info.is_main else None


def _prune(checkpoints_dir: Path, keep_last: int) -> None:
    for stale in checkpoints_dir.glob(".step-*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)  # left behind by a crashed save
    if keep_last > 0:
        for old in list_checkpoints(checkpoints_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)


def check_resumable(directory: str | Path, *, world_size: int) -> dict[str, Any]:
    """Metadata of a checkpoint that has everything a resume needs, else a coded refusal."""
    directory = Path(directory)
    meta = read_metadata(directory)
    verify_files(directory, meta)
    missing = [name for name in REQUIRED_STATE if not (directory / name).is_file()]
    if missing:
        raise CheckpointError(
            f"{directory}: cannot resume, missing {', '.join(missing)} (a model-only export is not a"
            " training checkpoint)",
            code="missing_state",
        )
    if meta.get("world_size") != world_size:
        raise CheckpointError(
            f"{directory}: saved with world_size={meta.get('world_size')}, resuming with {world_size};"
            " RNG streams and the data split are per rank, so an exact resume needs the same world size",
            code="world_size_mismatch",
        )
    return meta


def load_trainer_state(directory: Path, info: DistInfo) -> dict[str, Any]:
    state = json.loads((directory / "trainer_state.json").read_text())
    ranks = torch.load(directory / "rng.pt", map_location="cpu", weights_only=True)["ranks"]
    state["rng"] = ranks[info.rank]
    return state
