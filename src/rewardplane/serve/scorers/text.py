"""Text reward-model scorers: `hf_seqcls` (Hugging Face sequence classification, one label) and
`rm` (rewardplane reward-model checkpoints).

Both tokenise an item exactly as training and evaluation do (`rewardplane.data.tokenize`): the
prompt as user turn(s), the response as assistant turn(s), through the tokenizer's chat template
(rewardplane's plain template when there is none; `tokenize_branch`); the reward is read at the
last token. An item whose prompt and response are both plain strings is tokenised as the model
was trained to read plain text (option `plain_text`): `text_eos` is TRL's convention, as
training tokenises a plain-text pair's branch (`encode_plain_texts`: `tokenizer(prompt +
response + EOS)` with the tokenizer's own special tokens, EOS appended unless the response ends
with it, no chat template); `chat_template` renders them as a user/assistant conversation, as
rewardplane did before issue 24. The default is what the model directory records: a rewardplane
checkpoint's `plain_text` (none recorded: `chat_template`), or the one `rewardplane export hf`
wrote into `rewardplane_export.json`; a directory that records nothing (a Hugging Face model, a
named shape) keeps `chat_template`, as these scorers always served string items (third-party
RMs are mostly trained on conversations, and their users rely on it). An explicit option
overrides that default; one that contradicts what the directory records is a ConfigError at
load (it would score inputs unlike the ones the model was trained on). Serving and evaluation
therefore give the same number for the same checkpoint.

Items are tokenised on admission (`prepare`, on the batcher's admission threads), so the scoring
thread only packs and runs forwards. On CUDA in bf16/fp16, for decoder families whose attention
`rk_varlen` serves (Llama, Qwen2/3, Mistral, Gemma), a batch is one padding-free packed forward
(models/packed_scoring.py) of at most `max_batch_tokens` tokens; with `prefix_sharing` the
prompt a group of responses shares (GRPO) is computed once. Elsewhere (CPU, fp32, other
families) batches run as length-sorted padded buckets. `/v1/scorers` says which (`attention`).

Options: `TextOptions` below (`SeqClsOptions` adds `trust_remote_code`), one table per kind in
docs/serve.md.
"""

from __future__ import annotations

import collections
import json
import threading
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from rewardplane.core.errors import ConfigError, RewardplaneError
from rewardplane.data.tokenize import CHAT_TEMPLATE, TEXT_EOS
from rewardplane.serve.admission import PROMPT, RESPONSE
from rewardplane.serve.protocol import RAW_TEXT, ItemError, ScoreItem
from rewardplane.serve.scorers.common import ModelScorer, as_messages, as_text, torch_dtype, weights_digest
from rewardplane.serve.scorers.options import ScorerOptions

TEXT_SHAPES = ("tiny-text-rm", "qwen2-0.5b", "llama-3.2-1b", "llama-3.1-8b")
"""`tiny-text-rm` for tests; the others are real model shapes, random-initialised on the device."""

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Say hello. Hello! How can I help you today?",
    "A reward model scores a response to a prompt; higher is better.",
    "user assistant system: answer the question politely and correctly.",
] * 8


PROMPT_CACHE_ENTRIES = 1024
"""Rendered prompts kept per scorer (option `prompt_cache`; 0 turns the cache off)."""

PIPELINE_DEPTH = 2
"""Batches in flight at once on the packed CUDA path (option `pipeline_depth`, 1 to 4). Two by
default: while one forward runs the next batch fills (`queues_on_device`: until its token budget
is full or the device is about to free), is planned, copied and queued behind it, so the GPU goes
from one forward straight into the next. On the H200 (docs/benchmarks/serve_text.md, run 7) two
beat one in all eight comparisons: +3 to +7% without prefix sharing, +9 to +17% with it. Two
launched with whatever was queued (run 6) fragmented the batches and lost; that rule is gone."""

PROMPT_CACHE_CHARS = 32 * 1024 * 1024
"""...and at most this many characters of prompt text in all, whatever the entry count."""


class PromptCache:
    """Rendered, tokenised prompts by prompt (data/tokenize.RenderedPrompt), least recently used
    out first: a GRPO group's G responses share one prompt, whether they arrive in one request
    or several. Bounded by entries and by characters; shared by the admission threads.

    It holds chat-template renderings only: `text_eos` items (plain text, no template) bypass
    it, so a string prompt's key always means its rendering as a user turn."""

    def __init__(self, max_entries: int, max_chars: int = PROMPT_CACHE_CHARS) -> None:
        self.max_entries, self.max_chars = max_entries, max_chars
        self._entries: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    @staticmethod
    def key(prompt: str | list[dict[str, str]]) -> tuple[Any, ...]:
        """A text prompt is its own key; a list of plain `{role, content}` string messages (what
        the trainer routes send), its (role, content) pairs; any other message list, its canonical
        JSON. The three kinds of key never compare equal."""
        if isinstance(prompt, str):
            return (False, prompt)
        try:
            pairs = tuple((m["role"], m["content"]) for m in prompt if len(m) == 2)
        except (KeyError, TypeError):
            pairs = ()
        if len(pairs) == len(prompt) and all(isinstance(x, str) for pair in pairs for x in pair):
            return (None, pairs)
        return (True, json.dumps(prompt, sort_keys=True, ensure_ascii=False, default=str))

    @staticmethod
    def _size(key: tuple[Any, ...], rendered: Any) -> int:
        body = key[1]
        chars = len(body) if isinstance(body, str) else sum(len(r) + len(c) for r, c in body)
        return chars + len(rendered.text)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple[Any, ...]) -> Any:
        with self._lock:
            rendered = self._entries.get(key)
            if rendered is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return rendered

    def put(self, key: tuple[Any, ...], rendered: Any) -> None:
        size = self._size(key, rendered)
        if self.max_entries <= 0 or size > self.max_chars:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._chars -= self._size(key, old)
            self._entries[key] = rendered
            self._chars += size
            while len(self._entries) > self.max_entries or self._chars > self.max_chars:
                evicted, value = self._entries.popitem(last=False)
                self._chars -= self._size(evicted, value)


class TextOptions(ScorerOptions):
    """The options of `rm` (and, with `trust_remote_code`, of `hf_seqcls`)."""

    max_length: int = Field(2048, ge=1)
    """Tokens per item: longer items lose their oldest prompt tokens (training's truncation); a
    response alone longer than this is `too_long`."""
    max_batch_tokens: int = Field(65536, ge=1)
    """Tokens per packed forward (the padding-free CUDA path)."""
    attention: Literal["auto", "varlen", "padded"] = "auto"
    """`auto`: padding-free packed forwards where `rk_varlen` serves the model (CUDA, bf16/fp16,
    Llama/Qwen2/3/Mistral/Gemma), padded buckets elsewhere; `varlen` refuses to load otherwise."""
    prefix_sharing: bool = False
    """Packed path: compute the prompt a group of responses shares (GRPO) once."""
    min_prefix: int = Field(16, ge=0)
    """Tokens two items must share before their prefix is computed once."""
    empty_response: Literal["error", "score"] | Annotated[float, Field(allow_inf_nan=False)] = "error"
    """An empty or whitespace-only response: `error` (`bad_input`), `score` (scored as given), or
    a number (that fixed reward)."""
    prompt_cache: int = Field(PROMPT_CACHE_ENTRIES, ge=0)
    """Rendered prompts kept for the rest of their group (0: none); scores do not depend on it."""
    pipeline_depth: int = Field(PIPELINE_DEPTH, ge=1, le=4)
    """Batches in flight on the packed CUDA path (the next queued behind the running forward);
    scores do not depend on it."""
    plain_text: Literal["text_eos", "chat_template"] | None = None
    """How items whose prompt and response are both strings are tokenised: `text_eos` (TRL's
    plain text + EOS) or `chat_template`; null: what the model directory records, else
    `chat_template` (the identity holds the convention in use). One that contradicts the record
    is refused at load."""
    complete_turn: bool | None = None
    """OpenRLHF raw mode (`/get_reward`): a query that ends with the chat template's end-of-turn
    text (ChatML's `<|im_end|>`) gets what the template renders after it (ChatML's newline)
    before the reward is read, where a `template_end` model was trained to be read. null: on
    for a checkpoint or export that records `score_position: template_end`, off otherwise (a
    Hugging Face directory is read as OpenRLHF's own server reads it)."""
    seed: int = 0
    """Named shapes: the seed of the random initialisation."""
    tokenizer: str | None = None
    """Named shapes: a local tokenizer directory instead of the built-in one."""

    not_in_identity: ClassVar[frozenset[str]] = frozenset(
        {"prompt_cache", "pipeline_depth", "trust_remote_code"}
    )


class SeqClsOptions(TextOptions):
    trust_remote_code: bool = False
    """Run Python code shipped in the model directory (transformers' `trust_remote_code`)."""


class SeqClsScorer(ModelScorer):
    kind: ClassVar[str] = "hf_seqcls"
    modality: ClassVar = "text"
    reads: ClassVar[frozenset[str]] = frozenset({PROMPT, RESPONSE})
    Options = SeqClsOptions
    shapes: ClassVar[tuple[str, ...]] = TEXT_SHAPES

    def __init__(self, name: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(name, *args, **kwargs)
        o = self.options
        self.max_length, self.pipeline_depth = o.max_length, o.pipeline_depth
        self.prompts = PromptCache(o.prompt_cache)
        self.plain_text = o.plain_text or CHAT_TEMPLATE  # settled in load(), against what the model records
        self.turn_end: tuple[str, str] | None = None  # complete_turn: settled in load()
        self.attention = "padded"
        self.backbone = self.head = None
        self.pooled_pad: int | None = None
        self._local = threading.local()  # each scoring thread's token accounting of its last batch

    def _load_model(self):
        """(model, tokenizer, weights digest)."""
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if self.shape is not None:
            from rewardplane.data.builtin_tokenizer import build_tokenizer
            from rewardplane.models.tiny import tiny_config

            if self.options.tokenizer:
                tokenizer = AutoTokenizer.from_pretrained(self.options.tokenizer, local_files_only=True)
            else:
                tokenizer = build_tokenizer(_CORPUS, vocab_size=512)
            tiny = self.shape == "tiny-text-rm"
            config = tiny_config(
                "tiny-llama" if tiny else self.shape, num_labels=1, pad_token_id=tokenizer.pad_token_id
            )
            config.vocab_size = len(tokenizer) if tiny else max(config.vocab_size, len(tokenizer))
            torch.manual_seed(self.options.seed)
            # real shapes are initialised on the device: an 8B random init on the host takes minutes
            with torch.device("cpu" if tiny else self.device):
                model = AutoModelForSequenceClassification.from_config(config, dtype=torch_dtype(self.dtype))
            return model, tokenizer, f"shape:{self.shape}:seed={self.options.seed}"
        trust = self.options.trust_remote_code
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
        self.plain_text = self._settle_plain_text()  # before the weights: a refusal costs no load
        model, tokenizer, self._weights = self._load_model()
        self.pooled_pad = self._pooled_pad(model)  # before the scorer gives the config a pad id
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        self.model = model.to(device=self.device).eval()
        self.tokenizer = tokenizer
        self.turn_end = self._settle_complete_turn()
        self.backbone, self.head = self._backbone_and_head()
        self.attention = self._choose_attention()
        self.packs_tokens = self.attention == "varlen"
        if self.packs_tokens:
            import rewardplane.models.attention  # noqa: F401  (registers rk_varlen)

            self.backbone.set_attn_implementation("rk_varlen")

    def _pooled_pad(self, model: Any) -> int | None:
        """The pad id a plain transformers forward pools around: `*ForSequenceClassification`
        reads its logit at the rightmost token that is not the config's pad id (at the last
        token where the config has none). With pad == eos, a sequence that ends in EOS is read
        *before* that EOS; the scorer trims such trailing tokens on admission, so its packed
        and padded paths, which read at each sequence's last token, give HF's own number."""
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        return getattr(config, "pad_token_id", None)

    def _settle_plain_text(self) -> str:
        """How plain-text items are tokenised: the `plain_text` option, else what the model
        directory records (`models.loading.recorded_plain_text`), else `chat_template`. An option
        that contradicts the record is a one-line ConfigError naming both."""
        from rewardplane.models.loading import recorded_plain_text

        option = self.options.plain_text
        recorded = None if self.path is None else recorded_plain_text(self.path)
        if option is not None and recorded is not None and option != recorded:
            raise ConfigError(
                f"scorer {self.name!r}: options.plain_text is {option!r} but {self.path} was trained"
                f" with plain-text rows tokenised as {recorded!r}; drop the option or set it to {recorded!r}"
            )
        return option or recorded or CHAT_TEMPLATE

    def _settle_complete_turn(self) -> tuple[str, str] | None:
        """The template's (end-of-turn text, suffix) that raw queries are completed with, or None:
        the `complete_turn` option, else on where the model directory records `template_end`.
        On without a template that renders an end of turn is a one-line ConfigError."""
        from rewardplane.data.tokenize import TEMPLATE_END, turn_end
        from rewardplane.models.loading import recorded_score_position

        option = self.options.complete_turn
        if option is None:
            option = self.path is not None and recorded_score_position(self.path) == TEMPLATE_END
        if not option:
            return None
        end = turn_end(self.tokenizer)
        if end is None and self.options.complete_turn:
            raise ConfigError(
                f"scorer {self.name!r}: options.complete_turn needs a chat template that ends a turn"
                " with text (this tokenizer has none); drop the option"
            )
        return end

    def _complete_turn(self, text: str) -> str:
        """A raw query that stops at (or within) the template's end of an assistant turn, with
        the rest of that end appended (`complete_turn`)."""
        if self.turn_end is None:
            return text
        end, suffix = self.turn_end
        for k in range(len(suffix), -1, -1):  # the longest part of the suffix already there
            if text.endswith(end + suffix[:k]):
                return text + suffix[k:]
        return text

    def _backbone_and_head(self):
        """(backbone, last-token head) when the model scores as head(last hidden), else (None, None)."""
        from rewardplane.models.reward_model import last_token_parts

        return last_token_parts(self.model)

    def _choose_attention(self) -> str:
        from rewardplane.models.packed_scoring import VARLEN_FAMILIES, varlen_supported

        config = self.backbone.config if self.backbone is not None else None
        able = varlen_supported(config, self.device, torch_dtype(self.dtype))
        option = self.options.attention
        if option == "varlen" and not able:
            raise ConfigError(
                f"scorer {self.name!r}: attention varlen needs CUDA, bf16/fp16 and a model family in"
                f" {sorted(VARLEN_FAMILIES)}"
            )
        return "varlen" if able and option != "padded" else "padded"

    def encode(self, item: ScoreItem) -> list[int] | ItemError:
        """Token ids of prompt + response, or the per-item reason they cannot be scored."""
        return self.encode_many([item])[0]

    def encode_many(self, items: list[ScoreItem]) -> list[list[int] | ItemError]:
        """`encode` for several items in one tokenizer call per convention. Conversations: each
        distinct prompt rendered and tokenised once (and kept in the prompt cache for the rest of
        its group), the ids exactly `tokenize_branch`'s (data/tokenize.py, RenderedPrompt).
        Plain-text items under `text_eos`: `plain_text_branches`, the ids training gives a
        plain-text pair's branch."""
        from rewardplane.data.tokenize import encode_branches, plain_text_branches

        out: list[Any] = [None] * len(items)
        todo: list[tuple[int, Any, str]] = []  # (position, rendered prompt, text to encode)
        plain: list[tuple[int, str, str]] = []  # (position, prompt, response): text_eos items
        for k, item in enumerate(items):
            if (item.metadata or {}).get(RAW_TEXT) is True and isinstance(item.response, str):
                out[k] = self._raw_ids(item.response)
            elif self._text_eos(item):
                plain.append((k, item.prompt, item.response))  # type: ignore[arg-type]
            else:
                try:
                    todo.append((k, *self._branch_text(item)))
                except RewardplaneError as exc:
                    out[k] = ItemError("bad_input", f"{exc.code}: {exc.message}")
                except (ValueError, TypeError) as exc:  # empty message lists, odd types
                    out[k] = ItemError("bad_input", f"cannot encode: {exc}"[:500])
        for group, encode in ((todo, encode_branches), (plain, plain_text_branches)):
            for (k, *_), branch in zip(group, self._encoded(encode, group), strict=True):
                out[k] = self._read_where_hf_pools(self._fit(branch))
        return out

    def _read_where_hf_pools(self, ids: list[int] | ItemError) -> list[int] | ItemError:
        """`ids` without trailing pad ids (see `_pooled_pad`): by causality the hidden state at
        the last kept token is the same with or without them, so this is HF's score."""
        pad = self.pooled_pad
        if pad is None or isinstance(ids, ItemError) or not ids or ids[-1] != pad:
            return ids
        end = len(ids)
        while end and ids[end - 1] == pad:
            end -= 1
        return ids[:end] if end else ItemError("bad_input", "every token is the model's pad token")

    def _encoded(self, encode: Any, group: list[tuple[int, Any, str]]) -> list[Any]:
        """`encode(tokenizer, prompts, texts)`'s branches for a group's items in one tokenizer
        call; where that call fails (lone surrogates), the one item's bad_input, or the error
        raised so that the items are tried each alone."""
        if not group:
            return []
        try:
            return encode(self.tokenizer, [g[1] for g in group], [g[2] for g in group])
        except (ValueError, TypeError) as exc:
            if len(group) > 1:
                raise
            return [ItemError("bad_input", f"cannot encode: {exc}"[:500])]

    def _text_eos(self, item: ScoreItem) -> bool:
        """Whether the item is plain text tokenised as TRL does (no chat template): prompt and
        response both strings, under `plain_text: text_eos`. Message lists keep the template."""
        return self.plain_text == TEXT_EOS and isinstance(item.prompt, str) and isinstance(item.response, str)

    def _branch_text(self, item: ScoreItem) -> tuple[Any, str]:
        """(the item's rendered prompt, from the cache when its group was seen, and the text
        `encode_branches` encodes for it)."""
        from rewardplane.core.errors import UsageError
        from rewardplane.data.tokenize import branch_text, render_prompt

        prompt = as_messages(item.prompt, "user")
        response = as_messages(item.response, "assistant")
        key = PromptCache.key(item.prompt)
        rendered = self.prompts.get(key)
        if rendered is not None:
            try:
                return rendered, branch_text(self.tokenizer, prompt, rendered, response)
            except UsageError:  # a template that renders differently over time (today's date)
                pass
        rendered = render_prompt(self.tokenizer, prompt)
        text = branch_text(self.tokenizer, prompt, rendered, response)
        self.prompts.put(key, rendered)
        return rendered, text

    def _fit(self, branch: Any) -> list[int] | ItemError:
        """A branch's ids within `max_length` (oldest prompt tokens cut, as training's truncation
        does), or why it cannot be scored."""
        if isinstance(branch, ItemError):
            return branch
        if branch is None:
            return ItemError("bad_input", "empty_completion: completion has no tokens")
        ids = branch.input_ids
        if len(ids) > self.max_length:
            if sum(branch.loss_mask) > self.max_length:
                return ItemError(
                    "too_long", f"response has {sum(branch.loss_mask)} tokens, max_length {self.max_length}"
                )
            ids = ids[len(ids) - self.max_length :]
        return ids

    def _raw_ids(self, text: str) -> list[int] | ItemError:
        """A whole decoded sequence (special tokens as text) tokenised as given (its turn
        completed under `complete_turn`), oldest tokens cut past `max_length`: the reward is read
        at its last token."""
        try:
            ids = self.tokenizer(self._complete_turn(text), add_special_tokens=False)["input_ids"]
        except (ValueError, TypeError) as exc:
            return ItemError("bad_input", f"cannot encode: {exc}"[:500])
        if not ids:
            return ItemError("bad_input", "the text has no tokens")
        return list(ids[-self.max_length :])

    def prepare(self, item: ScoreItem) -> list[int] | ItemError:
        """Tokenise on admission (after the admission contract, `serve/admission.py`, which
        applies `empty_response`): token ids, or why the item cannot be scored."""
        return self.prepare_many([item])[0]

    def prepare_many(self, items: list[ScoreItem]) -> list[list[int] | ItemError]:
        """`prepare` for a request's items together: one tokenizer call (fast tokenizers encode a
        batch with the GIL released), a GRPO group's prompt rendered and tokenised once."""
        return self.encode_many(items)

    def prepared_tokens(self, prepared: Any) -> int:
        return len(prepared) if isinstance(prepared, list) else 0

    def take_batch_stats(self) -> dict[str, int]:
        """The calling scoring thread's last batch (batches may be in flight on two threads)."""
        stats = getattr(self._local, "stats", {})
        self._local.stats = {}
        return stats

    @property
    def concurrent_batches(self) -> int:  # type: ignore[override]
        """`pipeline_depth` batches at once on the packed CUDA path, one elsewhere.

        Why: with one batch at a time the GPU idles from the end of each forward until the next
        is planned, copied and launched (results handed back, the next batch taken, its plan
        built, kernels queued): several milliseconds per forward. A second batch, launched from
        its own thread while the first runs, is queued on the same stream behind it, so the GPU
        goes from one forward straight into the next. The packed path makes this safe: its
        host-to-device copies are from pinned memory and its result waits on an event, so
        neither synchronises the stream the other batch is running on (models/packed_scoring.py),
        and a forward keeps no state on the module. The threads queue their forwards' kernels one
        whole forward at a time (`packed_scoring.stream_launch_lock`): interleaved, both
        forwards ended together and the GPU waited while both threads took their next batches
        (H200 runs 8-9 in docs/benchmarks/serve_text.md). The padded CPU path gains nothing
        from it: two forwards would only share the same cores."""
        return self.pipeline_depth if self.attention == "varlen" else 1

    @property
    def queues_on_device(self) -> bool:  # type: ignore[override]
        """Batches in flight run one after another on the device's stream."""
        return self.attention == "varlen"

    def item_tokens(self, item: ScoreItem) -> int:
        # An estimate (≈3 characters per token) keeps the event loop free of tokenisation;
        # the budget only needs to be roughly right to bound padded batch size.
        return min(self.max_length, (len(as_text(item.prompt)) + len(as_text(item.response))) // 3 + 8)

    def _forward(self, input_ids, attention_mask, lengths):
        """One score per right-padded row, at its last token (`lengths - 1`), as the packed path
        reads it: HF's own pooling would look for the pad id instead, which the scorer may have
        set to EOS. A model whose head is not `score(last hidden)` pools itself."""
        if self.backbone is not None:
            from rewardplane.models.packed_scoring import last_token_forward

            return last_token_forward(self.backbone, self.head)(input_ids, attention_mask, lengths)
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits[:, 0]

    def score_batch(self, items: list[ScoreItem]) -> list[float | ItemError]:
        return self.score_prepared([self.prepare(i) for i in items])

    def score_prepared(self, batch: list[Any]) -> list[float | ItemError]:
        """One score per prepared item: packed forwards of at most `max_batch_tokens` tokens on
        the varlen path, length-sorted padded buckets otherwise."""
        import torch

        from rewardplane.models.packed_scoring import score_sequences

        results: list[Any] = list(batch)
        rows = [k for k, r in enumerate(results) if isinstance(r, list)]
        if not rows:
            return results
        seqs = [results[k] for k in rows]
        with torch.inference_mode():
            scores, self._local.stats = score_sequences(
                seqs,
                varlen=self.attention == "varlen",
                max_batch_tokens=self.options.max_batch_tokens,
                backbone=self.backbone,
                head=self.head,
                forward=self._forward,
                pad_token_id=self.tokenizer.pad_token_id,
                device=self.device,
                share_prefixes=self.options.prefix_sharing,
                min_prefix=self.options.min_prefix,
            )
        for k, v in zip(rows, scores.tolist(), strict=True):
            results[k] = v
        return results

    def identity_options(self) -> dict[str, Any]:
        """The plain-text convention and `complete_turn` in use, whether set or recorded by the
        model directory."""
        return {
            **super().identity_options(),
            "plain_text": self.plain_text,
            "complete_turn": self.turn_end is not None,
        }

    def info_extra(self) -> dict[str, Any]:
        return {
            **super().info_extra(),
            "attention": self.attention,
            "prefix_sharing": self.options.prefix_sharing and self.attention == "varlen",
            "pipeline_depth": self.concurrent_batches,
            "plain_text": self.plain_text,
            "complete_turn": self.turn_end is not None,
        }


class RewardModelScorer(SeqClsScorer):
    """A rewardplane reward-model checkpoint, loaded by `rewardplane.models.loading.load_reward_model`
    (which also accepts HF sequence-classification directories) and run through its
    `forward(batch)` contract: rewardplane heads stay fp32 whatever the backbone dtype."""

    kind: ClassVar[str] = "rm"
    Options = TextOptions

    def _pooled_pad(self, model: Any) -> int | None:
        """None: a reward-model checkpoint is read at its last token, whatever that token is."""
        return None

    def _load_model(self):
        if self.shape is not None:
            return super()._load_model()
        from rewardplane.models.loading import load_reward_model

        model, tokenizer, _metadata = load_reward_model(self.path, "cpu", torch_dtype(self.dtype))
        return model, tokenizer, weights_digest(self.path)

    def _forward(self, input_ids, attention_mask, lengths):
        if self.shape is not None:
            return super()._forward(input_ids, attention_mask, lengths)
        from rewardplane.data.collate import Batch

        batch = Batch.scored_at_last_token(input_ids, attention_mask, lengths)
        return self.model(batch)
