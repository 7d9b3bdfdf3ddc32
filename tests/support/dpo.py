"""DPO test builders shared by the recipe and LoRA tests: a tiny config, its metrics, a pinned SFT snapshot."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from huggingface_hub._local_folder import write_download_metadata
from transformers import AutoModelForCausalLM

from rewardplane.core.hashing import sha256_file
from rewardplane.data.synth import builtin_tokenizer
from rewardplane.models.reference import git_blob_sha1
from rewardplane.models.tiny import tiny_config
from rewardplane.train.config import load_dpo_config

REVISION = "89abcdef0123456789abcdef0123456789abcdef"

OVERRIDES = (
    "model.tiny=tiny-llama",
    "data.synth.train_rows=48",
    "data.synth.eval_rows=16",
    "data.max_length=96",
    "data.max_completion_length=48",
    "run.max_steps=3",
    "run.global_batch_pairs=8",
    "run.eval_batch_size=16",
    "run.progress=false",
    "optim.lr=2e-3",
    "optim.schedule=constant",
)


def config(run_dir: Path, *overrides: str):
    return load_dpo_config(None, [*OVERRIDES, f"run.run_dir={run_dir}", *overrides])


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


LORA = ("model.lora.r=4", "model.lora.alpha=8", "dpo.reference.source=initial_policy")


def lora_config(run_dir, *overrides):
    return config(run_dir, *LORA, *overrides)


def sft_snapshot(snapshot: Path) -> Path:
    """A tiny-llama saved to `snapshot`, pinned at REVISION with huggingface_hub's local_dir metadata."""
    torch.manual_seed(3)
    sft = AutoModelForCausalLM.from_config(tiny_config("tiny-llama", vocab_size=len(builtin_tokenizer())))
    sft.save_pretrained(snapshot)
    for path in sorted(p for p in snapshot.iterdir() if p.is_file()):
        etag = git_blob_sha1(path) if path.suffix == ".json" else sha256_file(path)
        write_download_metadata(snapshot, path.name, REVISION, etag)
    return snapshot
