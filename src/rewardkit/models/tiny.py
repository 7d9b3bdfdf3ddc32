"""Small offline building blocks: an in-process byte-level BPE tokenizer and tiny model configs.

No weights or tokenizers can be downloaded at run time, so the demo and the tests build
tokenizers here (trained in a fraction of a second with `tokenizers`) and random-initialised
models from the named configs below. The real loading code (local directories,
`local_files_only=True`) is exercised on checkpoints saved from these.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

SPECIAL_TOKENS = {
    "bos_token": "<|bos|>",
    "eos_token": "<|eos|>",
    "pad_token": "<|pad|>",
    "unk_token": "<|unk|>",
}

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

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
}


def build_tokenizer(corpus: Iterable[str], *, vocab_size: int = 1024, chat_template: bool = True):
    """Train a byte-level BPE tokenizer in-process and wrap it as a `PreTrainedTokenizerFast`.

    Byte-level pre-tokenisation means any text tokenises (no unknown characters), so the
    tokenizer generalises beyond the corpus it was trained on.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [*SPECIAL_TOKENS.values(), "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL_TOKENS)
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    if chat_template:
        fast.chat_template = CHATML_TEMPLATE
    return fast


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
