"""The `judge` scorer's in-process engine (`backend: transformers`): a local causal LM that answers
the judge's chat messages itself, for small judges where a separate engine is not worth running.

It only produces what an OpenAI-compatible endpoint would send back: the answer's text and, for
`score_from: logprobs`, per generated token its text and top log-probabilities (the endpoint's
`choices[0].logprobs.content` shape). Prompting and parsing stay in `judge.py`, shared by both
backends, so the same answer text scores the same whichever backend produced it.

Generation is greedy (the judge's `temperature: 0`) with the model's own chat template, in
batches sorted by prompt length, left-padded, up to `max_new_tokens`; a prompt's answer ends at
the first end-of-sequence token (the tokenizer's and the model's generation config's). The log
probabilities are the model's own: log-softmax over the full vocabulary of the logits that chose
each token, recorded during generation (no second forward).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Answer:
    text: str
    logprobs: list[dict[str, Any]] | None
    """One entry per generated token, `{"token", "logprob", "top_logprobs": [{"token",
    "logprob"}]}`, whose tokens spell `text`; None unless top log-probabilities were asked for."""
    tokens: int
    """Generated tokens, the end-of-sequence token included when there was one."""
    truncated: bool = False
    """No end-of-sequence token within `max_new_tokens`: the answer was cut off (`finish_reason:
    length` on an endpoint), so the scorer never parses it."""


class _TopLogprobs:
    """A logits processor that leaves the logits alone and keeps each step's top-k log-softmax
    (values and token ids, on the device until generation ends)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.steps: list[tuple[Any, Any]] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        top = torch.log_softmax(scores.float(), dim=-1).topk(self.k, dim=-1)
        self.steps.append((top.values, top.indices))
        return scores


class LocalJudgeModel:
    """A causal LM and its tokenizer from a local directory (`local_files_only`), on one device."""

    def __init__(self, path: str, *, dtype: str, device: str, trust_remote_code: bool = False) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from rewardplane.serve.scorers.common import torch_dtype

        self.path = path
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(
            path, local_files_only=True, trust_remote_code=trust_remote_code
        )
        if not self.tokenizer.chat_template:
            raise ValueError(f"{path}: the tokenizer has no chat template to render the judge's messages")
        self.model = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, dtype=torch_dtype(dtype), trust_remote_code=trust_remote_code
        ).to(self.device)
        self.model.eval()
        eos: set[int] = set()
        for source in (
            self.tokenizer.eos_token_id,
            getattr(self.model.generation_config, "eos_token_id", None),
        ):
            if isinstance(source, int):
                eos.add(source)
            elif isinstance(source, list | tuple):
                eos.update(int(t) for t in source)
        if not eos:
            raise ValueError(f"{path}: neither the tokenizer nor the generation config names an EOS token")
        self.eos = sorted(eos)
        pad = self.tokenizer.pad_token_id
        self.pad = pad if pad is not None else self.eos[0]
        self._pieces: dict[int, str] = {}

    def render(self, messages: list[dict[str, str]]) -> list[int]:
        """The model's chat template with the generation prompt, as token ids (the template
        holds any BOS itself, so the tokenizer adds no special tokens)."""
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def generate(
        self, prompts: list[list[int]], *, max_new_tokens: int, batch_size: int, top_logprobs: int | None
    ) -> list[Answer]:
        """Greedy answers to token-id prompts, in order; batches of similar lengths."""
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out: list[Answer | None] = [None] * len(prompts)
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            for i, answer in zip(
                chunk, self._generate([prompts[i] for i in chunk], max_new_tokens, top_logprobs), strict=True
            ):
                out[i] = answer
        return [a for a in out if a is not None]

    def _generate(
        self, prompts: list[list[int]], max_new_tokens: int, top_logprobs: int | None
    ) -> list[Answer]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):  # left padding: every answer starts at column `width`
            ids[row, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[row, width - len(p) :] = 1
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            eos_token_id=self.eos,
            pad_token_id=self.pad,
        )
        recorder = _TopLogprobs(top_logprobs) if top_logprobs else None
        with torch.inference_mode():
            seqs = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                generation_config=config,
                logits_processor=LogitsProcessorList([recorder]) if recorder else None,
            )
        generated = seqs[:, width:].tolist()
        steps = [(v.cpu(), i.cpu()) for v, i in recorder.steps] if recorder else []
        answers = []
        eos = set(self.eos)
        for row, gen in enumerate(generated):
            n = next((k for k, t in enumerate(gen) if t in eos), len(gen))
            answer_ids = gen[:n]
            tokens = min(len(gen), n + 1)
            cut = n == len(gen) and len(gen) >= max_new_tokens
            if recorder is None:
                text = self.tokenizer.decode(answer_ids, skip_special_tokens=True)
                answers.append(Answer(text, None, tokens, cut))
                continue
            logprobs = self._logprobs(answer_ids, [(v[row], i[row]) for v, i in steps[:n]])
            answers.append(Answer("".join(e["token"] for e in logprobs), logprobs, tokens, cut))
        return answers

    def _piece(self, token_id: int) -> str:
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = self.tokenizer.decode([token_id])
        return piece

    def _logprobs(self, answer_ids: list[int], steps: list[tuple[Any, Any]]) -> list[dict[str, Any]]:
        """The endpoint's `logprobs.content` for one answer. Each token's text is what it adds to
        the decoded answer so far (an incomplete UTF-8 sequence adds nothing until it completes),
        so the tokens spell exactly the decoded answer, as the parser checks."""
        entries = []
        emitted = ""
        for k, (values, indices) in enumerate(steps):
            full = self.tokenizer.decode(answer_ids[: k + 1], skip_special_tokens=True)
            piece = ""
            if full.startswith(emitted) and not full.endswith("\ufffd"):
                piece, emitted = full[len(emitted) :], full
            chosen = answer_ids[k]
            top = [
                {"token": self._piece(int(t)), "logprob": float(v)}
                for v, t in zip(values.tolist(), indices.tolist(), strict=True)
            ]
            chosen_lp = next(
                (c["logprob"] for c, t in zip(top, indices.tolist(), strict=True) if t == chosen), None
            )
            entries.append({"token": piece, "logprob": chosen_lp, "top_logprobs": top})
        return entries
