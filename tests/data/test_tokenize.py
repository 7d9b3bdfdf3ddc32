"""Tokenisation: template use, score index and loss mask, both truncation policies, hashes."""

from __future__ import annotations

import pytest

from rewardplane.core.errors import ConfigError, UsageError
from rewardplane.data import reasons as R
from rewardplane.data.builtin_tokenizer import build_tokenizer
from rewardplane.data.normalize import normalize_row
from rewardplane.data.reasons import Rejection
from rewardplane.data.synth import builtin_tokenizer, corpus
from rewardplane.data.tokenize import (
    TokenizeSettings,
    branch_text,
    completion_text,
    encode_branches,
    encode_texts,
    load_tokenizer,
    render_prompt,
    template_sha256,
    tokenize_branch,
    tokenize_pair,
    tokenizer_sha256,
)
from support.tokenizers import llama3_like, mistral_like


@pytest.fixture(scope="module")
def tok():
    return builtin_tokenizer()


@pytest.fixture(scope="module")
def bert_like():
    """A WordPiece encoder tokenizer like BERT's: CLS/SEP, no BOS/EOS, no chat template, lowercasing."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.train_from_iterator(corpus(), trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def pair(prompt="Name a fruit.", chosen="kiwi and plum.", rejected="red.", **extra):
    """A one-turn conversation (plain-string rows skip the chat template: test_tokenize_plain_text)."""
    return normalize_row(
        {
            "id": "p",
            "prompt": [{"role": "user", "content": prompt}],
            "chosen": [{"role": "assistant", "content": chosen}],
            "rejected": [{"role": "assistant", "content": rejected}],
            **extra,
        }
    )


def completion_tokens(tokenizer, branch):
    return [t for t, m in zip(branch.input_ids, branch.loss_mask, strict=True) if m]


def test_chat_template_branch_layout(tok):
    tp = tokenize_pair(pair(), tok)
    branch = tp.chosen
    prompt_text = tok.apply_chat_template(
        [{"role": "user", "content": "Name a fruit."}], tokenize=False, add_generation_prompt=True
    )
    n_prompt = branch.loss_mask.count(0)
    assert branch.input_ids[:n_prompt] == tok(prompt_text, add_special_tokens=False)["input_ids"]
    assert branch.loss_mask == [0] * n_prompt + [1] * (len(branch) - n_prompt)
    # template_end (default): the completion is everything the template renders after the
    # prompt, ChatML's trailing "\n" included, and the score is read there (as TRL reads it)
    assert tok.decode(completion_tokens(tok, branch)) == "kiwi and plum.<|im_end|>\n"
    assert branch.score_index == len(branch) - 1
    full = tok.apply_chat_template(
        [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "kiwi and plum."}],
        tokenize=True,
        return_dict=True,
    )["input_ids"]
    assert branch.input_ids == list(full)
    assert tp.rejected.input_ids[:n_prompt] == branch.input_ids[:n_prompt]
    assert tok.decode(completion_tokens(tok, tp.rejected)) == "red.<|im_end|>\n"
    # end_of_turn (checkpoints before issue 24): cut after the end-of-turn marker
    legacy = tokenize_pair(pair(), tok, TokenizeSettings(score_position="end_of_turn")).chosen
    assert tok.decode(completion_tokens(tok, legacy)) == "kiwi and plum.<|im_end|>"
    assert legacy.input_ids[legacy.score_index] == tok.convert_tokens_to_ids("<|im_end|>")


def test_multi_turn_completion_and_metadata(tok):
    p = normalize_row(
        {
            "prompt": "q",
            "chosen": [{"role": "assistant", "content": "a1"}, {"role": "assistant", "content": "a2"}],
            "rejected": "b",
            "margin": 1.5,
            "metadata": {"subset": "s"},
        }
    )
    tp = tokenize_pair(p, tok)
    assert (
        tok.decode(completion_tokens(tok, tp.chosen)) == "a1<|im_end|>\n<|im_start|>assistant\na2<|im_end|>\n"
    )
    assert (tp.margin, tp.subset, tp.pair_id) == (1.5, "s", p.pair_id)


def test_pad_equal_to_eos_keeps_the_final_eos_in_the_completion():
    tokenizer = build_tokenizer(corpus(), vocab_size=400, chat_template=False)
    tokenizer.pad_token = tokenizer.eos_token
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    branch = tokenize_pair(pair(), tokenizer).chosen
    assert branch.input_ids[0] == tokenizer.bos_token_id
    assert branch.input_ids[-1] == tokenizer.eos_token_id and branch.score_index == len(branch) - 1
    assert branch.loss_mask[-1] == 1
    assert tokenizer.decode(completion_tokens(tokenizer, branch)) == "kiwi and plum.<|eos|>"
    prompt = tokenizer.decode(branch.input_ids[: branch.loss_mask.count(0)])
    assert prompt == "<|bos|>user: Name a fruit.\n\nassistant: "


def test_plain_template_for_an_encoder_without_eos(bert_like):
    assert bert_like.chat_template is None and bert_like.eos_token is None and bert_like.bos_token is None
    branch = tokenize_pair(pair(), bert_like).chosen
    assert branch.input_ids[0] == bert_like.cls_token_id
    assert branch.input_ids[branch.score_index] == bert_like.sep_token_id == branch.input_ids[-1]
    assert bert_like.decode(completion_tokens(bert_like, branch)) == "kiwi and plum . [SEP]"


def test_identical_token_ids_are_rejected(bert_like):
    with pytest.raises(Rejection) as info:
        tokenize_pair(pair(chosen="Kiwi.", rejected="kiwi."), bert_like)
    assert info.value.reason == R.IDENTICAL


def lengths(tok, p):
    tp = tokenize_pair(p, tok, TokenizeSettings(max_length=10_000, max_completion_length=10_000))
    n_prompt = tp.chosen.loss_mask.count(0)
    return n_prompt, len(tp.chosen) - n_prompt, len(tp.rejected) - n_prompt


def test_drop_policy_limits_are_inclusive(tok):
    p = pair()
    n_prompt, n_chosen, n_rejected = lengths(tok, p)
    exact = TokenizeSettings(max_length=n_prompt + n_chosen, max_completion_length=n_chosen)
    assert len(tokenize_pair(p, tok, exact).chosen) == n_prompt + n_chosen
    for settings in (
        TokenizeSettings(max_length=n_prompt + n_chosen - 1, max_completion_length=100),
        TokenizeSettings(max_length=1000, max_completion_length=n_chosen - 1),
    ):
        with pytest.raises(Rejection) as info:
            tokenize_pair(p, tok, settings)
        assert info.value.reason == R.OVERSIZE and info.value.pair_id == "p"


def test_truncate_cuts_completion_end_then_prompt_front(tok):
    p = pair(prompt="Name a fruit. " * 5, chosen="kiwi and plum and pear.", rejected="red and blue.")
    n_prompt, n_chosen, n_rejected = lengths(tok, p)
    full = tokenize_pair(p, tok, TokenizeSettings(max_length=10_000, max_completion_length=10_000))
    settings = TokenizeSettings(max_length=12, max_completion_length=4, truncation="truncate")
    tp = tokenize_pair(p, tok, settings)
    for cut, whole in ((tp.chosen, full.chosen), (tp.rejected, full.rejected)):
        assert len(cut) == 12 and cut.loss_mask == [0] * 8 + [1] * 4
        # the prompt keeps its last 8 tokens, the completion its first 4
        assert cut.input_ids[:8] == whole.input_ids[n_prompt - 8 : n_prompt]
        assert cut.input_ids[8:] == whole.input_ids[n_prompt : n_prompt + 4]
        assert cut.score_index == 11
    # a pair that fits is left alone by the truncate policy
    roomy = TokenizeSettings(max_length=10_000, max_completion_length=10_000, truncation="truncate")
    assert tokenize_pair(p, tok, roomy) == full


def test_truncate_post_truncation_and_oversize(tok):
    shared = "kiwi " * 30
    p = pair(chosen=shared + "plum.", rejected=shared + "red.")
    with pytest.raises(Rejection) as info:
        tokenize_pair(
            p, tok, TokenizeSettings(max_length=200, max_completion_length=10, truncation="truncate")
        )
    assert info.value.reason == R.POST_TRUNCATION
    with pytest.raises(Rejection) as info:  # the default policy drops the same pair as oversize
        tokenize_pair(p, tok, TokenizeSettings(max_length=200, max_completion_length=10))
    assert info.value.reason == R.OVERSIZE
    with pytest.raises(Rejection) as info:  # completions alone fill max_length: no room for the prompt
        tokenize_pair(
            pair(), tok, TokenizeSettings(max_length=3, max_completion_length=3, truncation="truncate")
        )
    assert info.value.reason == R.OVERSIZE


def test_settings_validation():
    assert TokenizeSettings() == TokenizeSettings(1024, 512, "drop", "template_end", "text_eos")
    with pytest.raises(ConfigError):
        TokenizeSettings(truncation="left")
    with pytest.raises(ConfigError, match="plain_text must be one of text_eos, chat_template"):
        TokenizeSettings(plain_text="eos")
    with pytest.raises(ConfigError):
        TokenizeSettings(max_length=1)


def test_template_that_rewrites_the_prompt_is_refused():
    tokenizer = build_tokenizer(corpus(), vocab_size=300)
    tokenizer.chat_template = "{{ messages | length }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(UsageError, match="prefix"):
        tokenize_pair(pair(), tokenizer)


def test_tokenize_branch_matches_pair_branches(tok):
    p = pair()
    assert tokenize_branch(tok, p.prompt, p.chosen) == tokenize_pair(p, tok).chosen


PROMPTS = [
    [{"role": "user", "content": "Name a fruit."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there!\n\nHow are you?"}],
    [{"role": "user", "content": "naïve café — 漢字 🎉 <|im_start|> [INST] 123456"}],
]
COMPLETIONS = [
    "kiwi and plum.",
    " leading space",
    "\n\nnewlines first",
    "ends with a newline\n",
    "  two spaces, then <|im_end|> or [/INST] as text",
    "漢字 🎉 123",
]


@pytest.mark.parametrize("name", ["chatml", "llama3", "mistral", "plain", "bert"])
def test_rendered_prompt_branches_equal_encoding_prompt_and_completion_together(name, tok, bert_like):
    """A prompt rendered and tokenised once (what a scorer caches for a GRPO group) gives every
    completion exactly the ids of the unshared joint encoding, and with a chat template exactly
    `apply_chat_template(conversation, tokenize=True)`'s, at the boundary too."""
    tokenizer = {
        "chatml": lambda: tok,
        "llama3": llama3_like,
        "mistral": mistral_like,
        "plain": lambda: build_tokenizer(corpus(), vocab_size=400, chat_template=False),
        "bert": lambda: bert_like,
    }[name]()
    for prompt in PROMPTS:
        if name == "mistral":
            prompt = prompt[-1:]  # its template alternates user/assistant from the first turn
        rendered = render_prompt(tokenizer, prompt)
        if name in ("chatml", "llama3", "mistral"):
            assert rendered.cut > 0 and len(rendered.head) > 0  # the split is taken
            assert tokenizer(rendered.tail, add_special_tokens=False)["input_ids"][0] in set(
                tokenizer.added_tokens_decoder
            )
        completions = [[{"role": "assistant", "content": c}] for c in COMPLETIONS]
        texts = [branch_text(tokenizer, prompt, rendered, c) for c in completions]
        shared = encode_branches(tokenizer, [rendered] * len(texts), texts)
        for completion, branch in zip(completions, shared, strict=True):
            text = completion_text(tokenizer, prompt, rendered.text, completion, "template_end")
            prompt_ids, (completion_ids,) = encode_texts(tokenizer, rendered.text, [text], joint=True)
            assert branch.input_ids == prompt_ids + completion_ids
            assert branch.loss_mask == [0] * len(prompt_ids) + [1] * len(completion_ids)
            if tokenizer.chat_template is not None:
                whole = tokenizer.apply_chat_template(
                    [*prompt, *completion], tokenize=True, return_dict=True
                )["input_ids"]
                assert branch.input_ids == list(whole)


def test_a_split_that_would_change_the_prompt_ids_is_not_taken(tok, monkeypatch):
    prompt = [{"role": "user", "content": "Name a fruit."}]
    assert render_prompt(tok, prompt).cut > 0
    real = type(tok).__call__

    def tail_differs(self, text, *args, **kwargs):
        out = real(self, text, *args, **kwargs)
        if isinstance(text, str) and text.startswith("<|im_start|>assistant"):
            out["input_ids"] = [*out["input_ids"], 0]
        return out

    monkeypatch.setattr(type(tok), "__call__", tail_differs)
    rendered = render_prompt(tok, prompt)
    assert (rendered.cut, rendered.head, rendered.tail) == (0, (), rendered.text)


def test_hashes_survive_save_and_load_and_ignore_runtime_state(tok, tmp_path):
    before = tokenizer_sha256(tok), template_sha256(tok)
    tok.save_pretrained(tmp_path / "tok")
    loaded = load_tokenizer(str(tmp_path / "tok"))
    assert (tokenizer_sha256(loaded), template_sha256(loaded)) == before
    loaded(["a", "a b c"], padding=True, truncation=True, max_length=2)  # mutates backend padding state
    assert tokenizer_sha256(loaded) == before[0]
    assert tokenize_pair(pair(), loaded) == tokenize_pair(pair(), tok)
    other = build_tokenizer(corpus(), vocab_size=300)
    assert tokenizer_sha256(other) != before[0]
    plain = build_tokenizer(corpus(), vocab_size=300, chat_template=False)
    assert template_sha256(plain) != template_sha256(other)


def test_load_tokenizer_errors(tmp_path):
    assert load_tokenizer("builtin") is builtin_tokenizer()
    with pytest.raises(UsageError, match="not a directory"):
        load_tokenizer(str(tmp_path / "missing"))
    with pytest.raises(UsageError, match="cannot load tokenizer"):
        load_tokenizer(str(tmp_path))
