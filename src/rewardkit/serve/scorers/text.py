"""Text reward-model scorers: `hf_seqcls` (Hugging Face sequence classification, one label) and
`rm` (rewardkit reward-model checkpoints).

Both tokenise an item exactly as training and evaluation do (`rewardkit.data.tokenize.
tokenize_branch`): the prompt as user turn(s), the response as assistant turn(s), through the
tokenizer's chat template (rewardkit's plain template when there is none); the reward is read
at the last completion token. Serving and evaluation therefore give the same number for the
same checkpoint. One right-padded forward per batch.

Options: `trust_remote_code` (default false; only honoured when set in the config),
`max_length` (default 2048 tokens: longer items lose their oldest prompt tokens, as training's
truncation does; a response alone longer than that is a `too_long` item error), `seed` (shapes).
"""

from __future__ import annotations

from typing import Any, ClassVar

from rewardkit.core.errors import ConfigError, RewardkitError
from rewardkit.serve.scorers.base import ItemError, ScoreItem
from rewardkit.serve.scorers.common import (
    ModelScorer,
    as_messages,
    as_text,
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
            from rewardkit.data.builtin_tokenizer import build_tokenizer
            from rewardkit.models.tiny import tiny_config

            tokenizer = build_tokenizer(_CORPUS, vocab_size=512)
            config = tiny_config(
                "tiny-llama", vocab_size=len(tokenizer), num_labels=1, pad_token_id=tokenizer.pad_token_id
            )
            torch.manual_seed(int(self.options.get("seed", 0)))
            model = AutoModelForSequenceClassification.from_config(config).to(torch_dtype(self.dtype))
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
        self.model = model.to(device=self.device).eval()
        self.tokenizer = tokenizer

    def encode(self, item: ScoreItem) -> list[int] | ItemError:
        """Token ids of prompt + response, or the per-item reason they cannot be scored."""
        from rewardkit.data.tokenize import tokenize_branch

        try:
            branch = tokenize_branch(
                self.tokenizer, as_messages(item.prompt, "user"), as_messages(item.response, "assistant")
            )
        except RewardkitError as exc:
            return ItemError("bad_input", f"{exc.code}: {exc.message}")
        ids = branch.input_ids
        if len(ids) > self.max_length:
            if sum(branch.loss_mask) > self.max_length:
                return ItemError(
                    "too_long", f"response has {sum(branch.loss_mask)} tokens, max_length {self.max_length}"
                )
            ids = ids[len(ids) - self.max_length :]
        return ids

    def item_tokens(self, item: ScoreItem) -> int:
        # An estimate (≈3 characters per token) keeps the event loop free of tokenisation;
        # the budget only needs to be roughly right to bound padded batch size.
        return min(self.max_length, (len(as_text(item.prompt)) + len(as_text(item.response))) // 3 + 8)

    def _forward(self, input_ids, attention_mask, lengths):
        """One score per row; HF models pool at the last non-padding token themselves."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits[:, 0]

    def score_batch(self, items: list[ScoreItem]) -> list[float | ItemError]:
        import torch

        results: list[float | ItemError] = [self.encode(i) for i in items]
        rows = [k for k, r in enumerate(results) if isinstance(r, list)]
        if not rows:
            return results
        seqs = [results[k] for k in rows]
        width = max(map(len, seqs))
        input_ids = torch.full((len(seqs), width), self.tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, seq in enumerate(seqs):
            input_ids[r, : len(seq)] = torch.tensor(seq)
            attention_mask[r, : len(seq)] = 1
        lengths = torch.tensor([len(seq) for seq in seqs])
        with torch.inference_mode():
            scores = self._forward(
                input_ids.to(self.device), attention_mask.to(self.device), lengths.to(self.device)
            )
        for k, v in zip(rows, scores.float().cpu().tolist(), strict=True):
            results[k] = v
        return results

    def info_extra(self) -> dict[str, Any]:
        return {"max_length": self.max_length}


class RewardModelScorer(SeqClsScorer):
    """A rewardkit reward-model checkpoint, loaded by `rewardkit.models.loading.load_reward_model`
    (which also accepts HF sequence-classification directories) and run through its
    `forward(batch)` contract: rewardkit heads stay fp32 whatever the backbone dtype."""

    kind: ClassVar[str] = "rm"

    def _load_model(self):
        if self.shape is not None:
            return super()._load_model()
        from rewardkit.models.loading import load_reward_model

        model, tokenizer, _metadata = load_reward_model(self.path, "cpu", torch_dtype(self.dtype))
        return model, tokenizer, weights_digest(self.path)

    def _forward(self, input_ids, attention_mask, lengths):
        if self.shape is not None:
            return super()._forward(input_ids, attention_mask, lengths)
        import torch

        from rewardkit.data.collate import Batch

        rows = input_ids.shape[0]
        positions = (
            torch.arange(input_ids.shape[1], device=input_ids.device).expand(rows, -1) * attention_mask
        )
        batch = Batch(
            layout="right",
            input_ids=input_ids,
            position_ids=positions,
            attention_mask=attention_mask,
            segment_ids=None,
            score_rows=torch.arange(rows, device=input_ids.device),
            score_cols=lengths - 1,
            num_pairs=0,
            num_tokens=int(lengths.sum()),
        )
        return self.model(batch)
