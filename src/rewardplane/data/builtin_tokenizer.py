"""The built-in tokenizer: a byte-level BPE trained in-process on the data it will read.

No tokenizer can be downloaded at run time, so the demo, the synthetic task and the tests
train one here in a fraction of a second with `tokenizers`. It carries a ChatML template, so
conversations render exactly as a Qwen/SmolLM2-style chat model would see them.
"""

from __future__ import annotations

from collections.abc import Iterable

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
