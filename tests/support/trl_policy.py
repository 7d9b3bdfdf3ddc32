"""A tiny causal LM and its tokenizer for TRL's trainers on CPU (the integration tests)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from rewardplane.data.builtin_tokenizer import build_tokenizer
from rewardplane.models.tiny import tiny_config


def tiny_policy():
    tokenizer = build_tokenizer(
        ["Say hello to the world.", "Two plus two is four.", "Blue."] * 20, vocab_size=300
    )
    torch.manual_seed(0)
    config = tiny_config(
        "tiny-llama",
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    return AutoModelForCausalLM.from_config(config), tokenizer


def grpo_args(output_dir, tokenizer, **overrides):
    """TRL's `GRPOConfig` for a few CPU steps: groups of 4 completions of 3-8 tokens, every step
    logged, nothing saved or reported."""
    from trl import GRPOConfig

    no_text_ids = [i for i in tokenizer.all_special_ids if i != tokenizer.eos_token_id]
    settings = {
        "output_dir": str(output_dir),
        "use_cpu": True,
        "per_device_train_batch_size": 4,
        "num_generations": 4,
        "max_completion_length": 8,
        # never an empty completion (a bad_input item error): no early EOS, no other special token
        "generation_kwargs": {"min_new_tokens": 3, "suppress_tokens": no_text_ids},
        "logging_steps": 1,
        "report_to": [],
        "save_strategy": "no",
        "disable_tqdm": True,
    }
    return GRPOConfig(**{**settings, **overrides})
