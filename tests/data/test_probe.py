"""The probe contract: freezing is deterministic and every kind of drift is named."""

from __future__ import annotations

import dataclasses

import pytest

from rewardplane.data.builtin_tokenizer import build_tokenizer
from rewardplane.data.normalize import normalize_row
from rewardplane.data.probe import ProbeMismatch, check_probe, freeze_probe
from rewardplane.data.synth import builtin_tokenizer, generate_rows
from rewardplane.data.tokenize import TokenizeSettings, tokenize_pair


@pytest.fixture(scope="module")
def tok():
    return builtin_tokenizer()


@pytest.fixture(scope="module")
def tokenized(tok):
    return [tokenize_pair(normalize_row(row), tok) for row in generate_rows(20, seed=5)]


def mismatch(probe, pairs, **kwargs) -> str:
    with pytest.raises(ProbeMismatch) as info:
        check_probe(probe, pairs, **kwargs)
    assert info.value.code == "probe_mismatch"
    return info.value.message


def test_freeze_records_the_contract(tok, tokenized):
    probe = freeze_probe(tokenized, tok, TokenizeSettings())
    assert probe["count"] == 20 and probe["pair_ids"] == [p.pair_id for p in tokenized]
    assert probe["settings"] == {
        "max_length": 1024,
        "max_completion_length": 512,
        "truncation": "drop",
        "score_position": "template_end",
        "plain_text": "text_eos",
    }
    assert freeze_probe(iter(tokenized), tok) == probe  # any iterable, same result
    check_probe(probe, tokenized, tokenizer=tok, settings=TokenizeSettings())


def test_mismatches_say_what_differs(tok, tokenized):
    probe = freeze_probe(tokenized, tok)
    assert "count differs: probe has 20 pairs, data has 19" in mismatch(probe, tokenized[:19])
    swapped = [tokenized[1], tokenized[0], *tokenized[2:]]
    assert f"pair id differs at position 0: probe {tokenized[0].pair_id!r}" in mismatch(probe, swapped)
    branch = tokenized[3].chosen
    moved = dataclasses.replace(branch, score_index=branch.score_index - 1)
    changed = [*tokenized[:3], dataclasses.replace(tokenized[3], chosen=moved), *tokenized[4:]]
    assert f"tokens differ for pair {tokenized[3].pair_id!r} at position 3" in mismatch(probe, changed)
    masked = dataclasses.replace(branch, loss_mask=[1] * len(branch))
    changed[3] = dataclasses.replace(tokenized[3], chosen=masked)
    assert "at position 3" in mismatch(probe, changed)


def test_tokenizer_template_and_settings_drift(tok, tokenized):
    probe = freeze_probe(tokenized, tok)
    other = build_tokenizer(["something else entirely"], vocab_size=300)
    assert mismatch(probe, tokenized, tokenizer=other).startswith("tokenizer_sha256 differs")
    assert "settings differ" in mismatch(probe, tokenized, settings=TokenizeSettings(truncation="truncate"))
    tampered = {**probe, "tokens_sha256": "0" * 64}
    assert "token hash differs" in mismatch(tampered, tokenized)
    assert "not a rewardplane.probe/v1" in mismatch({"format": "x"}, tokenized)


def test_a_probe_frozen_before_plain_text_was_recorded_keeps_its_tokens(tok):
    """A probe without `plain_text` was frozen when plain-string rows went through the chat
    template: read back, its settings say so, its pairs re-tokenise to its hashes, and checked
    against today's default it refuses in one line naming the setting."""
    rows = generate_rows(20, seed=5)
    assert any(normalize_row(row).plain_text for row in rows)
    legacy = TokenizeSettings(plain_text="chat_template")
    old_pairs = [tokenize_pair(normalize_row(row), tok, legacy) for row in rows]
    probe = freeze_probe(old_pairs, tok, legacy)
    del probe["settings"]["plain_text"]  # as written before the key existed
    del probe["contract_sha256"]  # (and before the contract hash)
    settings = TokenizeSettings.from_json(probe["settings"])
    assert settings == legacy
    check_probe(probe, [tokenize_pair(normalize_row(row), tok, settings) for row in rows], settings=settings)
    message = mismatch(probe, old_pairs, settings=TokenizeSettings())
    assert message == (
        "tokenisation settings differ: plain_text probe 'chat_template', data 'text_eos'; refreeze the"
        " probe with `rewardplane data freeze-probe EVAL --plain-text text_eos --out PROBE` or train with"
        " the probe's settings (data.plain_text=chat_template)"
    )


def test_the_contract_hash_covers_the_settings_and_catches_an_edited_probe(tok, tokenized):
    """Two freezes of the same short pairs under different length limits give the same tokens
    (nothing is near the limits) but different contracts; a settings mismatch names both fixes;
    a probe whose settings were edited by hand no longer matches its own contract hash."""
    default = freeze_probe(tokenized, tok, TokenizeSettings())
    short = freeze_probe(tokenized, tok, TokenizeSettings(max_length=128, max_completion_length=64))
    assert default["tokens_sha256"] == short["tokens_sha256"]
    assert default["contract_sha256"] != short["contract_sha256"]
    message = mismatch(
        default, tokenized, settings=TokenizeSettings(max_length=128, max_completion_length=64)
    )
    assert "max_length probe 1024, data 128" in message
    assert "freeze-probe EVAL --max-length 128 --max-completion-length 64" in message
    assert "data.max_length=1024 data.max_completion_length=512" in message
    edited = {**short, "settings": {**short["settings"], "max_length": 1024, "max_completion_length": 512}}
    check_probe(default, tokenized, tokenizer=tok, settings=TokenizeSettings())
    assert "contract_sha256" in mismatch(edited, tokenized, settings=TokenizeSettings())
