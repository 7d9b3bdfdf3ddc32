"""Tokenise normalised pairs as TRL does (the chat template, or text + EOS), with an explicit truncation policy.

How a branch is built (one branch = prompt + one completion):

1. Render the prompt with `add_generation_prompt=True` and the whole conversation
   (prompt + completion) with the tokenizer's chat template. The completion text is what
   the full rendering adds after the prompt rendering; templates that rewrite earlier turns
   (so the prompt is not a prefix) are refused.
2. Trailing whitespace after the completion is dropped (ChatML's "\\n" after `<|im_end|>`
   belongs to the next turn), but the template's end-of-turn marker is kept: it is part of
   the completion. `loss_mask` is 1 on every completion token, end marker included, so a
   DPO policy learns to stop; `score_index` is the last completion token, i.e. the
   end-of-turn marker (`<|im_end|>`, `<|eot_id|>`, EOS), where a causal reward model has
   read the whole completion and knows it is finished.
3. Tokenizers without a chat template (BERT and other encoders) use `PLAIN_TEMPLATE`; the
   sequence starts with BOS (or CLS) and the completion ends with EOS (or SEP) when the
   tokenizer has one.

4. Plain-text pairs (TRL's "standard" rows: prompt, chosen and rejected all strings) follow
   TRL's RewardTrainer and DPOTrainer (`plain_text: text_eos`): no chat template; EOS is
   appended to each completion unless it already ends with it, and prompt + completion is
   encoded as one text by the tokenizer with its own special tokens (`tokenizer(text)`: BOS
   where the tokenizer adds one, CLS/SEP for encoders, which also have no EOS to append). The
   score is read at the last token, the EOS. `plain_text: chat_template` renders them as a
   user/assistant conversation instead, as rewardkit did before issue 24.

Positions are explicit, never found by searching for padding, so tokenizers whose pad token
equals EOS are handled correctly.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from rewardkit.core.errors import ConfigError, UsageError
from rewardkit.core.hashing import sha256_json, sha256_text
from rewardkit.data import reasons as R
from rewardkit.data.reasons import Rejection
from rewardkit.data.records import Message, PreferencePair, TokenizedBranch, TokenizedPair

BUILTIN = "builtin"

PLAIN_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] + ': ' + message['content'] + '\n\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)
"""Used when a tokenizer has no chat template: `role: content` blocks separated by a blank line."""

_SPECIAL_ATTRS = ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")


DEFAULT_MAX_LENGTH = 1024
DEFAULT_MAX_COMPLETION_LENGTH = 512
"""The one default for token limits: data commands, freeze-probe and training (TRL's max_length is 1024)."""

TEMPLATE_END = "template_end"
END_OF_TURN = "end_of_turn"
SCORE_POSITIONS = (TEMPLATE_END, END_OF_TURN)
"""Where a branch ends, hence where a reward model reads its score.

`template_end` (the default; TRL's RewardTrainer and RewardBench): the last token of
`apply_chat_template(conversation)` without a generation prompt — for ChatML the "\\n" after
`<|im_end|>`. `end_of_turn` (rewardkit before issue 24): the template's text after the
completion is cut after the end-of-turn marker. Checkpoints record theirs (`score_position`);
a checkpoint without the key was trained with `end_of_turn`.
"""

TEXT_EOS = "text_eos"
CHAT_TEMPLATE = "chat_template"
PLAIN_TEXT_MODES = (TEXT_EOS, CHAT_TEMPLATE)
"""How plain-text pairs are tokenised: `text_eos` (the default; TRL) or `chat_template` (rewardkit
before issue 24). Checkpoints and probes record theirs; one without the key used `chat_template`."""

LEGACY_SETTINGS = {"plain_text": CHAT_TEMPLATE}
"""Settings keys added after probes and checkpoints were first written, with the value that applied
before the key existed: what a recorded settings object without the key means."""


def recorded_settings(recorded: dict[str, Any]) -> dict[str, Any]:
    """A probe's or checkpoint's recorded settings, with the legacy value of every key it predates."""
    return {**LEGACY_SETTINGS, **recorded}


@dataclass(frozen=True)
class TokenizeSettings:
    """Length limits and what to do with pairs that exceed them.

    `drop` (the default) rejects an over-length pair as `oversize`, as TRL does: a cut
    completion may have lost exactly the part that made it better or worse, so a truncated
    comparison can teach the wrong preference. `truncate` keeps such pairs: completions are
    cut at the end to `max_completion_length`, then the prompt is cut from the front to fit
    `max_length`.
    """

    max_length: int = DEFAULT_MAX_LENGTH
    max_completion_length: int = DEFAULT_MAX_COMPLETION_LENGTH
    truncation: Literal["drop", "truncate"] = "drop"
    score_position: Literal["template_end", "end_of_turn"] = "template_end"
    plain_text: Literal["text_eos", "chat_template"] = "text_eos"

    def __post_init__(self) -> None:
        if self.truncation not in ("drop", "truncate"):
            raise ConfigError(f"truncation must be 'drop' or 'truncate', got {self.truncation!r}")
        if self.score_position not in SCORE_POSITIONS:
            raise ConfigError(
                f"score_position must be one of {', '.join(SCORE_POSITIONS)}, got {self.score_position!r}"
            )
        if self.plain_text not in PLAIN_TEXT_MODES:
            raise ConfigError(
                f"plain_text must be one of {', '.join(PLAIN_TEXT_MODES)}, got {self.plain_text!r}"
            )
        if self.max_length < 2 or self.max_completion_length < 1:
            raise ConfigError("max_length must be >= 2 and max_completion_length >= 1")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, recorded: dict[str, Any]) -> TokenizeSettings:
        """The settings a probe recorded (`recorded_settings`: older probes predate some keys)."""
        return cls(**recorded_settings(recorded))


def load_tokenizer(spec: str):
    """A local tokenizer directory (offline, no remote code) or `builtin`, the synth task's tokenizer."""
    if spec == BUILTIN:
        from rewardkit.data.synth import builtin_tokenizer

        return builtin_tokenizer()
    if not Path(spec).is_dir():
        raise UsageError(
            f"tokenizer {spec!r} is not a directory (give a local tokenizer directory or 'builtin')"
        )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(spec, local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # any failure to load a local directory is a usage error (exit 2), not a crash
        raise UsageError(f"cannot load tokenizer from {spec}: {str(exc).splitlines()[0]}") from None


def pad_token_id(tokenizer) -> int:
    """The id batches are padded with: the pad token, else EOS (many causal LMs have no pad), else 0.

    One rule for training and every evaluation, so a checkpoint is always scored on the same batches.
    """
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return int(pad or 0)


def template_sha256(tokenizer) -> str:
    """Hash of the chat template actually applied (the plain template when there is none)."""
    template = getattr(tokenizer, "chat_template", None)
    if template is None:
        return sha256_text("rewardkit-plain-template\n" + PLAIN_TEMPLATE)
    return sha256_text(template) if isinstance(template, str) else sha256_json(template)


def tokenizer_sha256(tokenizer) -> str:
    """Hash of what decides token ids: the vocabulary/merges/normaliser pipeline and special tokens.

    The backend's `truncation`/`padding` state is excluded: transformers changes it on the fly.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        pipeline = json.loads(backend.to_str())
        pipeline.pop("truncation", None)
        pipeline.pop("padding", None)
    else:
        pipeline = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    specials = {}
    for attr in _SPECIAL_ATTRS:
        token = getattr(tokenizer, attr, None)
        if token is not None:
            specials[attr] = [str(token), tokenizer.convert_tokens_to_ids(str(token))]
    return sha256_json({"pipeline": pipeline, "special_tokens": specials})


def render(tokenizer, messages: list[Message], *, add_generation_prompt: bool) -> str:
    """The template's text for `messages`; an empty prompt renders as "" (transformers refuses to
    template an empty conversation), so a prompt-less row's completion is its whole rendering."""
    if not messages:
        return ""
    template = getattr(tokenizer, "chat_template", None) or PLAIN_TEMPLATE
    return tokenizer.apply_chat_template(
        messages, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def completion_text(
    tokenizer,
    prompt: list[Message],
    prompt_text: str,
    completion: list[Message],
    score_position: str = END_OF_TURN,
) -> str:
    """The text the template renders for `completion` after `prompt_text`.

    `end_of_turn` drops the trailing whitespace (ChatML's "\\n" after `<|im_end|>`);
    `template_end` keeps everything the template renders, as `apply_chat_template` does. Without
    a chat template (the plain template) trailing whitespace is always dropped: EOS ends the branch.
    """
    full = render(tokenizer, [*prompt, *completion], add_generation_prompt=False)
    if not full.startswith(prompt_text):
        raise UsageError(
            "the tokenizer's chat template does not render the prompt as a prefix of the conversation, "
            "so the completion cannot be located"
        )
    text = full[len(prompt_text) :]
    if score_position == TEMPLATE_END and getattr(tokenizer, "chat_template", None) is not None:
        return text
    return text.rstrip()


def encode_texts(
    tokenizer,
    prompt_text: str,
    completions: list[str],
    *,
    joint: bool = False,
    add_special_tokens: bool = False,
) -> tuple[list[int], list[list[int]]]:
    """Token ids of the prompt and of each completion, in one tokenizer call.

    `add_special_tokens` lets the tokenizer add its own (TRL's `tokenizer(text)` for plain-text
    pairs). Otherwise chat templates write their own markers, and with the plain template the
    prompt starts with BOS (or CLS) and each completion ends with EOS (or SEP), when the
    tokenizer has them.
    `joint` encodes prompt + completion as one text (what `apply_chat_template(tokenize=True)`
    does), so a branch's ids are exactly the ecosystem's. The prompt part is the longest prefix
    of the prompt's own ids that every joint encoding starts with: where a template's boundary
    merges ("\\n\\n" + text in Llama-3 templates can tokenise differently together), the merged
    token counts as completion. Such a token is shared by both branches, so it cancels in a
    reward margin and in DPO's chosen-minus-rejected log-ratios. (TRL's DPOTrainer splits at the
    same shared prefix.)
    """
    texts = [prompt_text, *completions]
    if joint:
        texts += [prompt_text + c for c in completions]
    encoded = tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]
    prompt_ids = list(encoded[0])
    completion_ids = [list(ids) for ids in encoded[1 : 1 + len(completions)]]
    if joint:
        wholes = [list(ids) for ids in encoded[1 + len(completions) :]]
        shared = min(_common_prefix(prompt_ids, whole) for whole in wholes)
        prompt_ids = prompt_ids[:shared]
        completion_ids = [whole[shared:] for whole in wholes]
    if not add_special_tokens and getattr(tokenizer, "chat_template", None) is None:
        start = _first_id(tokenizer, "bos_token_id", "cls_token_id")
        end = _first_id(tokenizer, "eos_token_id", "sep_token_id")
        if start is not None:
            prompt_ids.insert(0, start)
        if end is not None:
            for ids in completion_ids:
                ids.append(end)
    return prompt_ids, completion_ids


def tokenize_branch(
    tokenizer, prompt: list[Message], completion: list[Message], *, score_position: str = TEMPLATE_END
) -> TokenizedBranch:
    """One untruncated branch (what a scorer feeds the model for a prompt + response).

    An empty prompt is refused (ValueError, as transformers refuses an empty conversation): a
    served item always has one; prompt-less data rows go through `tokenize_pair`.
    """
    if not prompt:
        raise ValueError("Cannot apply chat template to an empty conversation (empty prompt)")
    prompt_text = render(tokenizer, prompt, add_generation_prompt=True)
    text = completion_text(tokenizer, prompt, prompt_text, completion, score_position)
    prompt_ids, (completion_ids,) = encode_texts(
        tokenizer, prompt_text, [text], joint=score_position == TEMPLATE_END
    )
    if not completion_ids:
        raise Rejection(R.EMPTY_COMPLETION, "completion has no tokens")
    return _branch(prompt_ids, completion_ids)


def tokenize_pair(pair: PreferencePair, tokenizer, settings: TokenizeSettings | None = None) -> TokenizedPair:
    """Tokenise both branches under `settings`; raise `Rejection` (oversize, post_truncation, ...)."""
    settings = settings or TokenizeSettings()
    if pair.plain_text and settings.plain_text == TEXT_EOS:
        prompt_text, *completions = pair.texts()
        prompt_ids, (chosen, rejected) = encode_texts(
            tokenizer,
            prompt_text,
            [_with_eos(tokenizer, text) for text in completions],
            joint=True,
            add_special_tokens=True,
        )
    else:
        prompt_text = render(tokenizer, pair.prompt, add_generation_prompt=True)
        position = settings.score_position
        texts = [
            completion_text(tokenizer, pair.prompt, prompt_text, side, position)
            for side in (pair.chosen, pair.rejected)
        ]
        prompt_ids, (chosen, rejected) = encode_texts(
            tokenizer, prompt_text, texts, joint=position == TEMPLATE_END
        )
    if not chosen or not rejected:
        raise Rejection(R.EMPTY_COMPLETION, "a completion has no tokens", pair_id=pair.pair_id)
    limit, completion_limit = settings.max_length, settings.max_completion_length
    sizes = f"prompt {len(prompt_ids)}, chosen {len(chosen)}, rejected {len(rejected)} tokens"

    if settings.truncation == "drop":
        longest = max(len(chosen), len(rejected))
        if len(prompt_ids) + longest > limit or longest > completion_limit:
            raise Rejection(
                R.OVERSIZE,
                f"{sizes}; limits max_length={limit}, max_completion_length={completion_limit}",
                pair_id=pair.pair_id,
            )
        if chosen == rejected:
            raise Rejection(R.IDENTICAL, "chosen and rejected tokenize to the same ids", pair_id=pair.pair_id)
    else:
        cut = len(chosen) > completion_limit or len(rejected) > completion_limit
        chosen, rejected = chosen[:completion_limit], rejected[:completion_limit]
        if chosen == rejected:
            if cut:
                raise Rejection(
                    R.POST_TRUNCATION,
                    f"chosen and rejected are identical after cutting completions to {completion_limit} tokens",
                    pair_id=pair.pair_id,
                )
            raise Rejection(R.IDENTICAL, "chosen and rejected tokenize to the same ids", pair_id=pair.pair_id)
        budget = limit - max(len(chosen), len(rejected))
        if len(prompt_ids) > budget:
            if budget < 1:
                raise Rejection(
                    R.OVERSIZE,
                    f"{sizes}; after truncation no prompt token fits in max_length={limit}",
                    pair_id=pair.pair_id,
                )
            prompt_ids = prompt_ids[-budget:]
    return TokenizedPair(
        pair_id=pair.pair_id,
        chosen=_branch(prompt_ids, chosen),
        rejected=_branch(prompt_ids, rejected),
        margin=pair.margin,
        subset=pair.subset,
    )


def _with_eos(tokenizer, text: str) -> str:
    """TRL's `add_eos`: the EOS token's text appended unless the text already ends with it (a
    tokenizer without EOS, an encoder, ends the text with its own SEP instead)."""
    eos = tokenizer.eos_token
    return text if eos is None or text.endswith(eos) else text + eos


def _branch(prompt_ids: list[int], completion_ids: list[int]) -> TokenizedBranch:
    input_ids = [*prompt_ids, *completion_ids]
    return TokenizedBranch(
        input_ids=input_ids,
        loss_mask=[0] * len(prompt_ids) + [1] * len(completion_ids),
        score_index=len(input_ids) - 1,
    )


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _first_id(tokenizer, *attrs: str) -> int | None:
    for attr in attrs:
        value = getattr(tokenizer, attr, None)
        if value is not None:
            return int(value)
    return None
