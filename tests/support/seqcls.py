"""Tiny random `*ForSequenceClassification` decoders (Llama-, Qwen2-, Qwen3-, Mistral-shaped) that
the scoring tests compare against a plain transformers forward."""

from __future__ import annotations

import torch

VOCAB = 97


def seqcls(family: str, attn: str = "sdpa", *, vocab: int = VOCAB, pad_token_id: int = 0) -> torch.nn.Module:
    """A 2-layer, 64-wide classifier (num_labels 1) of `family`, seed 0, in eval mode."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from rewardplane.models.tiny import tiny_config

    if family == "llama":
        config = tiny_config("tiny-llama", vocab_size=vocab, num_labels=1, pad_token_id=pad_token_id)
    else:
        config = AutoConfig.for_model(
            family,
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_labels=1,
            pad_token_id=pad_token_id,
        )
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config, attn_implementation=attn)
    return model.eval()


def plain_scores(model: torch.nn.Module, seqs: list[list[int]]) -> torch.Tensor:
    """Each sequence alone, unpadded, through the model's own forward: the reference score."""
    device = next(model.parameters()).device
    with torch.no_grad():
        return torch.tensor(
            [float(model(input_ids=torch.tensor([s], device=device)).logits[0, 0]) for s in seqs]
        )
