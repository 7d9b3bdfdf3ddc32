"""Text reward-model scorers: `hf_seqcls` (Hugging Face sequence classification, one label) and
`rm` (rewardkit reward-model checkpoints).

Both format an item the way chat reward models are trained: the prompt as user turn(s), the
response as assistant turn(s), through the tokenizer's chat template (plain `prompt\\nresponse`
when the tokenizer has none or `options.chat_template: false`). The reward is the head's
output at the last non-padding token, computed in one padded forward per batch.

Options: `trust_remote_code` (default false; only honoured when set in the config),
`max_length` (default 2048 tokens, longer inputs are truncated from the right),
`chat_template` (default true), `seed` (named shapes only).
"""

from __future__ import annotations

from typing import Any, ClassVar

from rewardkit.errors import ConfigError
from rewardkit.serve.scorers.base import ItemError, ScoreItem, ScorerInfo
from rewardkit.serve.scorers.common import (
    VERSION,
    ModelScorer,
    as_messages,
    as_text,
    identity,
    json_config,
    torch_dtype,
    weights_digest,
)

TEXT_SHAPES = ("tiny-text-rm",)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Say hello. Hello! How can I help you today?",
    "A reward model scores a response to a prompt; higher is better.",
    "user assistant system: answer the question politely and correctly.",
] * 8


class SeqClsScorer(ModelScorer):
    kind: ClassVar[str] = "hf_seqcls"
    modality: ClassVar = "text"
    allowed_options: ClassVar[frozenset[str]] = frozenset(
        {"trust_remote_code", "max_length", "chat_template", "seed"}
    )
    shapes: ClassVar[tuple[str, ...]] = TEXT_SHAPES

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.max_length = int(self.options.get("max_length", 2048))

    def _load_model(self):
        """(model, tokenizer, weights digest)."""
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if self.shape is not None:
            from rewardkit.models.tiny import build_tokenizer, tiny_config

            tokenizer = build_tokenizer(_CORPUS, vocab_size=512)
            config = tiny_config(
                "tiny-llama", vocab_size=len(tokenizer), num_labels=1, pad_token_id=tokenizer.pad_token_id
            )
            torch.manual_seed(int(self.options.get("seed", 0)))
            model = AutoModelForSequenceClassification.from_config(config)
            return model, tokenizer, f"shape:{self.shape}:seed={int(self.options.get('seed', 0))}"
        trust = self.options.get("trust_remote_code", False) is True
        tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True, trust_remote_code=trust)
        model = AutoModelForSequenceClassification.from_pretrained(
            self.path, local_files_only=True, trust_remote_code=trust, dtype=torch_dtype(self.dtype)
        )
        if model.config.num_labels != 1:
            raise ConfigError(
                f"scorer {self.name!r}: {self.path} has num_labels={model.config.num_labels}, need 1"
            )
        return model, tokenizer, weights_digest(self.path)

    def load(self) -> None:
        model, tokenizer, self._weights = self._load_model()
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        tokenizer.padding_side = "right"
        self.model = model.to(device=self.device, dtype=torch_dtype(self.dtype)).eval()
        self.tokenizer = tokenizer

    def format(self, item: ScoreItem) -> str:
        if self.options.get("chat_template", True) and getattr(self.tokenizer, "chat_template", None):
            messages = as_messages(item.prompt, "user") + as_messages(item.response, "assistant")
            return self.tokenizer.apply_chat_template(messages, tokenize=False)
        return f"{as_text(item.prompt)}\n{as_text(item.response)}"

    def item_tokens(self, item: ScoreItem) -> int:
        # An estimate (≈3 characters per token) keeps the event loop free of tokenisation;
        # the budget only needs to be roughly right to bound padded batch size.
        return min(self.max_length, (len(as_text(item.prompt)) + len(as_text(item.response))) // 3 + 8)

    def _forward(self, enc):
        return self.model(**enc).logits[:, 0]

    def score_batch(self, items: list[ScoreItem]) -> list[float | ItemError]:
        import torch

        enc = self.tokenizer(
            [self.format(i) for i in items],
            padding=True,
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
            add_special_tokens=False,
        )
        enc = {k: v.to(self.device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}
        with torch.inference_mode():
            return self._forward(enc).float().cpu().tolist()

    def info(self) -> ScorerInfo:
        opts = {k: v for k, v in self.options.items() if k != "trust_remote_code"}
        return ScorerInfo(
            name=self.name,
            kind=self.kind,
            modality=self.modality,
            dtype=self.dtype,
            device=self.device,
            version=VERSION,
            identity=identity(
                kind=self.kind,
                weights=self._weights,
                config=json_config(self.model.config),
                dtype=self.dtype,
                options=opts,
            ),
            max_batch_size=self.max_batch_size,
            max_wait_ms=self.max_wait_ms,
            extra={"path": self.path, "shape": self.shape, "max_length": self.max_length},
        )


class RewardModelScorer(SeqClsScorer):
    """A rewardkit reward-model checkpoint (scalar head), loaded by `rewardkit.models.loading`."""

    kind: ClassVar[str] = "rm"

    def _load_model(self):
        if self.shape is not None:
            return super()._load_model()
        from rewardkit.models.loading import load_reward_model

        model, tokenizer, _metadata = load_reward_model(self.path, "cpu", torch_dtype(self.dtype))
        return model, tokenizer, weights_digest(self.path)

    def _forward(self, enc):
        out = self.model(**enc)
        rewards = getattr(out, "rewards", out)
        return rewards.reshape(rewards.shape[0], -1)[:, -1]
