"""Small offline building blocks: tiny named model configs (the tokenizer is data/builtin_tokenizer.py).

No weights or tokenizers can be downloaded at run time, so the demo and the tests build
tokenizers here (trained in a fraction of a second with `tokenizers`) and random-initialised
models from the named configs below. The real loading code (local directories,
`local_files_only=True`) is exercised on checkpoints saved from these.
"""

from __future__ import annotations

from typing import Any

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    # A Llama-shaped decoder, ~0.2M parameters plus embeddings: trains in seconds on CPU.
    "tiny-llama": {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    },
    # A BERT-shaped encoder of the same size.
    "tiny-bert": {
        "model_type": "bert",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 1024,
    },
    # Qwen2-0.5B's shapes (random init) for GPU benchmarks.
    "qwen2-0.5b": {
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "vocab_size": 151936,
    },
    # Llama-3.2-1B's and Llama-3.1-8B's shapes (random init) for GPU benchmarks.
    "llama-3.2-1b": {
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "vocab_size": 128256,
    },
    "llama-3.1-8b": {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "vocab_size": 128256,
    },
}


def tiny_config(name: str, *, vocab_size: int | None = None, **overrides: Any):
    """An `AutoConfig` for one of `TINY_CONFIGS`, with the vocabulary sized to a tokenizer."""
    from transformers import AutoConfig

    if name not in TINY_CONFIGS:
        raise KeyError(f"unknown config {name!r}; known: {sorted(TINY_CONFIGS)}")
    spec = dict(TINY_CONFIGS[name])
    model_type = spec.pop("model_type")
    if vocab_size is not None:
        spec["vocab_size"] = vocab_size
    spec.update(overrides)
    return AutoConfig.for_model(model_type, **spec)
