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
   user/assistant conversation instead, as rewardplane did before issue 24.

Positions are explicit, never found by searching for padding, so tokenizers whose pad token
equals EOS are handled correctly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from rewardplane.core.errors import ConfigError, UsageError
from rewardplane.core.hashing import sha256_json, sha256_text
from rewardplane.data import reasons as R
from rewardplane.data.reasons import Rejection
from rewardplane.data.records import Message, PreferencePair, TokenizedBranch, TokenizedPair

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
`<|im_end|>`. `end_of_turn` (rewardplane before issue 24): the template's text after the
completion is cut after the end-of-turn marker. Checkpoints record theirs (`score_position`);
a checkpoint without the key was trained with `end_of_turn`.
"""

TEXT_EOS = "text_eos"
CHAT_TEMPLATE = "chat_template"
PLAIN_TEXT_MODES = (TEXT_EOS, CHAT_TEMPLATE)
"""How plain-text pairs are tokenised: `text_eos` (the default; TRL) or `chat_template` (rewardplane
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
        from rewardplane.data.synth import builtin_tokenizer

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
        # the pre-rename name stays: checkpoints and probes recorded this hash
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


_TURN_SENTINEL = "rewardplane-turn-sentinel"


def turn_end(tokenizer) -> tuple[str, str] | None:
    """(the end-of-turn text, what the template renders after it) of an assistant turn that ends
    a conversation: ChatML's ("<|im_end|>", "\\n"), Llama 3's ("<|eot_id|>", ""). What a policy's
    decoded sequence lacks when it stops at the end-of-turn token, and a `template_end` reward
    model was trained to be read after (OpenRLHF's raw mode, `complete_turn`). None without a
    chat template, or when the template renders no end-of-turn text after the content."""
    if getattr(tokenizer, "chat_template", None) is None:
        return None
    messages = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _TURN_SENTINEL}]
    try:
        text = render(tokenizer, messages, add_generation_prompt=False)
    except Exception:  # a template that refuses this conversation shape: nothing to complete
        return None
    at = text.rfind(_TURN_SENTINEL)
    if at < 0:
        return None
    tail = text[at + len(_TURN_SENTINEL) :]
    end = tail.rstrip()
    return (end, tail[len(end) :]) if end else None


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
) -> tuple[list[int], list[list[int]]]:
    """Token ids of the prompt and of each completion, in one tokenizer call.

    Chat templates write their own markers; with the plain template the prompt starts with BOS
    (or CLS) and each completion ends with EOS (or SEP), when the tokenizer has them. (Plain-text
    pairs under `text_eos` go through `encode_plain_texts` instead.)
    `joint` encodes prompt + completion as one text (what `apply_chat_template(tokenize=True)`
    does), so a branch's ids are exactly the ecosystem's. The prompt part is the longest prefix
    of the prompt's own ids that every joint encoding starts with: where a template's boundary
    merges ("\\n\\n" + text in Llama-3 templates can tokenise differently together), the merged
    token counts as completion. Such a token is shared by both branches, so it cancels in a
    reward margin and in DPO's chosen-minus-rejected log-ratios. (TRL's DPOTrainer splits at the
    same shared prefix.)
    """
    # joint: the completions alone are never encoded (only prompt + completion counts)
    texts = [prompt_text, *((prompt_text + c) if joint else c for c in completions)]
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    prompt_ids = list(encoded[0])
    completion_ids = [list(ids) for ids in encoded[1:]]
    if joint:
        wholes = completion_ids
        shared = min(_common_prefix(prompt_ids, whole) for whole in wholes)
        prompt_ids = prompt_ids[:shared]
        completion_ids = [whole[shared:] for whole in wholes]
    return _plain_markers(tokenizer, prompt_ids, completion_ids)


def encode_plain_texts(
    tokenizer, prompts: Sequence[str], completions: Sequence[str]
) -> list[tuple[list[int], int]]:
    """TRL's tokenisation of plain-text branches (`plain_text: text_eos`), in ONE tokenizer call:
    `(ids, prompt_tokens)` per (prompt, completion).

    `ids` is `tokenizer(prompt + completion + EOS)` with the tokenizer's own special tokens, EOS
    appended unless the completion already ends with it (`_with_eos`, TRL's `add_eos`): the
    branch TRL's RewardTrainer builds, read at its last token. `prompt_tokens` is the longest
    prefix of the prompt's own ids (each distinct prompt encoded once) that `ids` starts with; a
    token merged across the boundary counts as completion. `tokenize_pair` splits a pair at the
    shorter of its two branches' prefixes (where TRL's DPOTrainer splits); the serve text
    scorers use one branch's own.
    """
    if len(prompts) != len(completions):
        raise ValueError("encode_plain_texts needs one prompt per completion")
    distinct = list(dict.fromkeys(prompts))
    texts = [*distinct, *(p + _with_eos(tokenizer, c) for p, c in zip(prompts, completions, strict=True))]
    encoded = tokenizer(texts, add_special_tokens=True)["input_ids"] if completions else []
    own = {prompt: list(ids) for prompt, ids in zip(distinct, encoded, strict=False)}
    wholes = [list(ids) for ids in encoded[len(distinct) :]]
    return [(whole, _common_prefix(own[p], whole)) for p, whole in zip(prompts, wholes, strict=True)]


def plain_text_branches(
    tokenizer, prompts: Sequence[str], completions: Sequence[str]
) -> list[TokenizedBranch | None]:
    """One untruncated `text_eos` branch per (prompt, completion) (`encode_plain_texts`; what a
    scorer feeds the model for a plain-text item); None where the completion has no tokens."""
    return [
        _branch(ids[:k], ids[k:]) if ids[k:] else None
        for ids, k in encode_plain_texts(tokenizer, prompts, completions)
    ]


def _plain_markers(
    tokenizer, prompt_ids: list[int], completion_ids: list[list[int]]
) -> tuple[list[int], list[list[int]]]:
    """With the plain template (no chat template) the prompt starts with BOS (or CLS) and each
    completion ends with EOS (or SEP), when the tokenizer has them; in place."""
    if getattr(tokenizer, "chat_template", None) is None:
        start = _first_id(tokenizer, "bos_token_id", "cls_token_id")
        end = _first_id(tokenizer, "eos_token_id", "sep_token_id")
        if start is not None:
            prompt_ids.insert(0, start)
        if end is not None:
            for ids in completion_ids:
                ids.append(end)
    return prompt_ids, completion_ids


@dataclass(frozen=True)
class RenderedPrompt:
    """A prompt rendered (with the generation prompt) and tokenised once, for every completion
    scored after it: a GRPO group sends one prompt with G responses, and a scorer caches this.

    `cut` splits `text` where a suffix can be encoded on its own and still give the ids the
    whole text gives: just before the last added token (`<|im_start|>`, `<|eot_id|>`, ...).
    Fast tokenizers split the input at added tokens before normalising and pre-tokenising, so
    no token spans that point; `head` holds the ids of `text[:cut]`. A branch is then `head` +
    the ids of `text[cut:] + completion`: the boundary between prompt and completion (where a
    template's "\n\n" can merge with the completion's first word) is always encoded with both
    sides, exactly as `apply_chat_template(tokenize=True)` encodes it. Without an added token
    (the plain template) `cut` is 0 and the whole text is encoded with each completion.
    """

    text: str
    ids: tuple[int, ...]  # text's own ids
    cut: int
    head: tuple[int, ...]

    @property
    def tail(self) -> str:
        return self.text[self.cut :]


def render_prompt(tokenizer, prompt: list[Message]) -> RenderedPrompt:
    """Render and tokenise `prompt` once (see RenderedPrompt); the split is checked on the
    prompt's own ids, and not made where it would change them."""
    if not prompt:
        raise ValueError("Cannot apply chat template to an empty conversation (empty prompt)")
    text = render(tokenizer, prompt, add_generation_prompt=True)
    if not getattr(tokenizer, "is_fast", False):
        return RenderedPrompt(text, tuple(tokenizer(text, add_special_tokens=False)["input_ids"]), 0, ())
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = tuple(encoded["input_ids"]), encoded["offset_mapping"]
    added = set(tokenizer.added_tokens_decoder)
    at = next((j for j in range(len(ids) - 1, 0, -1) if ids[j] in added), 0)
    cut = offsets[at][0] if at else 0
    if cut and tuple(tokenizer(text[cut:], add_special_tokens=False)["input_ids"]) != ids[at:]:
        cut = at = 0  # a tokenizer this split does not hold for: encode the whole text each time
    return RenderedPrompt(text, ids, cut, ids[:at])


def branch_text(
    tokenizer,
    prompt: list[Message],
    rendered: RenderedPrompt,
    completion: list[Message],
    score_position: str = TEMPLATE_END,
) -> str:
    """What `encode_branches` encodes for one completion: the prompt's tail and the completion's
    text (`completion_text`), so the prompt/completion boundary is encoded as one text."""
    return rendered.tail + completion_text(tokenizer, prompt, rendered.text, completion, score_position)


def encode_branches(
    tokenizer, prompts: Sequence[RenderedPrompt], texts: Sequence[str]
) -> list[TokenizedBranch | None]:
    """One branch per (rendered prompt, `branch_text`), in ONE tokenizer call (a fast tokenizer
    encodes a batch with the GIL released); None where the completion has no tokens.

    The ids equal `apply_chat_template(prompt + completion, tokenize=True)`'s (the joint
    encoding of `encode_texts`); the prompt part, which the loss mask leaves out, is the longest
    prefix of the prompt's own ids that the branch starts with.
    """
    tails = tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []
    branches: list[TokenizedBranch | None] = []
    for rendered, tail in zip(prompts, tails, strict=True):
        whole = [*rendered.head, *tail]
        shared = len(rendered.head) + _common_prefix(rendered.ids[len(rendered.head) :], tail)
        prompt_ids, (completion_ids,) = _plain_markers(tokenizer, whole[:shared], [whole[shared:]])
        branches.append(_branch(prompt_ids, completion_ids) if completion_ids else None)
    return branches


def tokenize_branch(
    tokenizer, prompt: list[Message], completion: list[Message], *, score_position: str = TEMPLATE_END
) -> TokenizedBranch:
    """One untruncated branch (what a scorer feeds the model for a prompt + response).

    An empty prompt is refused (ValueError, as transformers refuses an empty conversation): a
    served item always has one; prompt-less data rows go through `tokenize_pair`.
    """
    if score_position != TEMPLATE_END:  # the completion is encoded apart from the prompt
        prompt_text = render(tokenizer, prompt, add_generation_prompt=True)
        text = completion_text(tokenizer, prompt, prompt_text, completion, score_position)
        prompt_ids, (completion_ids,) = encode_texts(tokenizer, prompt_text, [text])
        if not completion_ids:
            raise Rejection(R.EMPTY_COMPLETION, "completion has no tokens")
        return _branch(prompt_ids, completion_ids)
    rendered = render_prompt(tokenizer, prompt)
    (branch,) = encode_branches(tokenizer, [rendered], [branch_text(tokenizer, prompt, rendered, completion)])
    if branch is None:
        raise Rejection(R.EMPTY_COMPLETION, "completion has no tokens")
    return branch


def tokenize_pair(pair: PreferencePair, tokenizer, settings: TokenizeSettings | None = None) -> TokenizedPair:
    """Tokenise both branches under `settings`; raise `Rejection` (oversize, post_truncation, ...)."""
    settings = settings or TokenizeSettings()
    if pair.plain_text and settings.plain_text == TEXT_EOS:
        prompt_text, *completions = pair.texts()
        (chosen, k_chosen), (rejected, k_rejected) = encode_plain_texts(
            tokenizer, [prompt_text, prompt_text], completions
        )
        shared = min(k_chosen, k_rejected)
        prompt_ids, chosen, rejected = chosen[:shared], chosen[shared:], rejected[shared:]
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
