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


def scripted_causal_lm(
    name: str,
    tokenizer: Any,
    script: list[int],
    *,
    start: int,
    alternatives: dict[int, list[tuple[int, float]]] | None = None,
    margin: float = 30.0,
    dtype: Any = None,
    device: Any = None,
    seed: int = 0,
):
    """A causal LM of one of `TINY_CONFIGS`' shapes (Llama-style layers) whose greedy answer is
    `script`, token by token, after any prompt that ends in `start` (a chat template's generation
    prompt always ends in the same token). No real weights can be downloaded, and a random model
    rambles: this one gives a judge a real answer to parse, of a known length.

    How: every layer's attention output and MLP output projections are zero, so the last
    position's hidden state is its token's embedding; the embeddings of `start` and the script's
    tokens are distinct one-hot vectors and the (untied) output head maps each to the next
    token's logit `margin` (every other logit 0). `alternatives[k]` gives step k's runners-up as
    (token, logit below the scripted one), for log-probability tests. The compute per token is
    the shape's, whatever the values: fit for throughput measurements, not for quality.
    """
    import math

    import torch
    from transformers import AutoModelForCausalLM

    chain = [start, *script]
    config = tiny_config(
        name,
        vocab_size=len(tokenizer),
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if len(set(chain)) != len(chain) or len(chain) > config.hidden_size:
        raise ValueError("start and the script's tokens must be distinct, at most hidden_size of them")
    torch.manual_seed(seed)
    with torch.device(device or "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32)
    unit = margin / math.sqrt(config.hidden_size)  # RMSNorm turns a one-hot into sqrt(hidden) there
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        embed = model.get_input_embeddings().weight
        head = model.get_output_embeddings().weight
        head.zero_()
        for k, token in enumerate(chain):
            embed[token].zero_()
            embed[token, k] = 1.0
            if k + 1 < len(chain):
                head[chain[k + 1], k] = unit
        for k, runners in (alternatives or {}).items():
            for token, gap in runners:
                head[token, k] = (margin - gap) / math.sqrt(config.hidden_size)
    model.eval()
    return model
