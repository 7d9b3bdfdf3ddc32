"""Exported reward models score where the ecosystem scores: plain transformers, apply_chat_template, logits[0, 0].

TRL's RewardTrainer and RewardBench read the reward at the last token of
`apply_chat_template(messages)` (no generation prompt). A checkpoint trained by rewardplane and
exported with `rewardplane export hf` must give its own scores, within 1e-3 in fp32, through
exactly that recipe, for ChatML (which appends "\n" after <|im_end|>) and Llama-3-style templates.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rewardplane.cli import main
from rewardplane.data.normalize import normalize_row
from rewardplane.data.synth import builtin_tokenizer
from rewardplane.data.tokenize import TokenizeSettings, tokenize_branch, tokenize_pair
from rewardplane.models.loading import load_reward_model
from rewardplane.objectives.reward_model import score_pairs
from support.rm import train_tiny_checkpoint

torch.set_num_threads(1)

LLAMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

QWEN2_TINY = {
    "model_type": "qwen2",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}

SYSTEMS = ["You are a terse assistant.", "Answer in lowercase.", "Be kind."]
QUESTIONS = ["Name a fruit.", "Name an animal.", "Name a color.", "Another one?", "And a fruit?"]
ANSWERS = ["kiwi and plum.", "otter.", "teal.", "red.", "fig, pear and lime.", "wolf."]


def conversations(n: int = 24) -> list[list[dict]]:
    """Single- and multi-turn conversations, with and without system prompts, ending in an answer."""
    out = []
    for i in range(n):
        messages = [{"role": "system", "content": SYSTEMS[i % 3]}] if i % 2 == 0 else []
        for turn in range(1 + i % 3):
            messages.append({"role": "user", "content": QUESTIONS[(i + turn) % 5]})
            messages.append({"role": "assistant", "content": ANSWERS[(i * 3 + turn) % 6]})
        out.append(messages)
    return out


def _llama3_tokenizer():
    import copy

    tok = copy.deepcopy(builtin_tokenizer())  # builtin_tokenizer() is one shared, cached object
    tok.add_special_tokens(
        {"additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]}
    )
    tok.chat_template = LLAMA3_TEMPLATE
    return tok


@pytest.fixture(scope="module", params=["chatml-qwen2", "llama3-llama"])
def exported(request, tmp_path_factory):
    from rewardplane.train.config import load_config
    from rewardplane.train.recipe import run

    root = tmp_path_factory.mktemp(request.param)
    tok = builtin_tokenizer() if request.param.startswith("chatml") else _llama3_tokenizer()
    tok.save_pretrained(root / "tok")
    model = (
        ["model.config=" + json.dumps(QWEN2_TINY)] if "qwen2" in request.param else ["model.tiny=tiny-llama"]
    )
    cfg = load_config(
        None,
        [
            *model,
            f"data.tokenizer={root / 'tok'}",
            "data.synth={train_rows: 32, eval_rows: 8, seed: 0}",
            "data.max_length=128",
            "data.max_completion_length=64",
            f"run.run_dir={root / 'run'}",
            "run.max_steps=3",
            "run.global_batch_pairs=8",
            "run.progress=false",
            "optim.lr=3e-3",
        ],
    )
    result = run(cfg)
    out = root / "hf"
    assert main(["export", "hf", str(result.checkpoint), str(out)]) == 0
    return result.checkpoint, out


def test_standard_hf_recipe_gives_rewardplane_scores(exported):
    checkpoint, out = exported
    ours, tokenizer, meta = load_reward_model(checkpoint)
    assert meta["score_position"] == "template_end"
    tok = AutoTokenizer.from_pretrained(out)
    hf = AutoModelForSequenceClassification.from_pretrained(out, dtype=torch.float32).eval()
    convs = conversations(24)
    # rewardplane's own scores: evaluation's path (tokenize_pair + score_pairs) ...
    pairs = []
    for messages in convs:
        rejected = [*messages[:-1], {"role": "assistant", "content": "nothing at all."}]
        row = {"chosen": messages, "rejected": rejected}
        pairs.append(tokenize_pair(normalize_row(row), tokenizer, TokenizeSettings()))
    chosen, rejected = score_pairs(ours, pairs, batch_size=5, layout="packed")
    worst = 0.0
    with torch.no_grad():
        for i, messages in enumerate(convs):
            ids = tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
            # ... are read at the last template token, and the ids are the ecosystem's
            assert pairs[i].chosen.input_ids == list(ids)
            plain = hf(input_ids=torch.tensor([ids])).logits[0, 0].item()
            worst = max(worst, abs(plain - chosen[i]))
            # the serve path (tokenize_branch) reads the same position
            branch = tokenize_branch(tokenizer, messages[:-1], messages[-1:])
            assert branch.input_ids == list(ids)
            other = [*messages[:-1], {"role": "assistant", "content": "nothing at all."}]
            ids = tok.apply_chat_template(other, tokenize=True, return_dict=True)["input_ids"]
            worst = max(worst, abs(hf(input_ids=torch.tensor([ids])).logits[0, 0].item() - rejected[i]))
    print(f"{out.parent.name}: 48 branches, max abs difference {worst:.2e}")  # recorded in docs/export.md
    assert worst < 1e-3
    assert abs(chosen - rejected).max() > 1e-4  # a trained, non-constant model


def test_plain_text_rows_score_on_trl_ids_as_plain_transformers(exported):
    """Plain-string rows (TRL's standard format, a third of the synthetic training data) are the
    ids TRL's RewardTrainer builds (text + EOS, no chat template), and the checkpoint's score on
    them, through evaluation's path, is a plain transformers forward of the export on those ids."""
    from support.trl_data import trl_reward_ids

    checkpoint, out = exported
    ours, tokenizer, meta = load_reward_model(checkpoint)
    assert meta["plain_text"] == "text_eos"
    rows = [
        {"prompt": question, "chosen": " " + ANSWERS[i % 6], "rejected": " " + ANSWERS[(i + 1) % 6]}
        for i, question in enumerate(QUESTIONS)
    ]
    pairs = [tokenize_pair(normalize_row(row), tokenizer, TokenizeSettings()) for row in rows]
    chosen, rejected = score_pairs(ours, pairs, batch_size=3, layout="packed")
    hf = AutoModelForSequenceClassification.from_pretrained(out, dtype=torch.float32).eval()
    worst = 0.0
    with torch.no_grad():
        for i, ids in enumerate(trl_reward_ids(rows, AutoTokenizer.from_pretrained(out))):
            assert [pairs[i].chosen.input_ids, pairs[i].rejected.input_ids] == list(ids)
            for branch_ids, score in zip(ids, (chosen[i], rejected[i]), strict=True):
                plain = hf(input_ids=torch.tensor([branch_ids])).logits[0, 0].item()
                worst = max(worst, abs(plain - score))
    assert worst < 1e-3


def test_export_config_and_card(exported):
    checkpoint, out = exported
    config = json.loads((out / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(out)
    assert config["pad_token_id"] == tok.pad_token_id
    assert config["bos_token_id"] == tok.bos_token_id and config["eos_token_id"] == tok.eos_token_id
    card = (out / "README.md").read_text()
    meta = json.loads((checkpoint / "rewardplane.json").read_text())
    assert "template_end" in card and meta["train_pairs_sha256"] in card
    assert "apply_chat_template" in card and "probe accuracy" in card
    assert "tok(prompt + response + tok.eos_token)" in card and "text += tok.eos_token" in card
    # the convention travels with the export, for eval and serve to read (models.loading)
    assert json.loads((out / "rewardplane_export.json").read_text())["plain_text"] == "text_eos"
    assert load_reward_model(out)[2]["plain_text"] == "text_eos"
    summary = json.loads((checkpoint.parent.parent / "eval" / checkpoint.name / "summary.json").read_text())
    assert f"{summary['accuracy']:.4f}" in card and summary["probe_sha256"] in card


def test_legacy_end_of_turn_checkpoint_scores_as_trained(exported, tmp_path):
    """A checkpoint without score_position (trained before it was recorded) reads at the end-of-turn token."""
    import shutil

    checkpoint, out = exported
    # Llama-3's "<|end_header_id|>\n\n" + answer tokenises differently as one text than split
    # (docs/export.md): the ids differ, not only the position, so the scores agree exactly only
    # for ChatML; the rest (the recorded position, the export's card) holds for both.
    exact = "llama3" not in str(out)
    legacy = tmp_path / "legacy"
    shutil.copytree(checkpoint, legacy)
    meta = json.loads((legacy / "rewardplane.json").read_text())
    del meta["score_position"]
    (legacy / "rewardplane.json").write_text(json.dumps(meta))
    model, tokenizer, meta = load_reward_model(legacy)
    assert meta["score_position"] == "end_of_turn"
    messages = conversations(3)[2]
    rejected = [*messages[:-1], {"role": "assistant", "content": "nothing."}]
    row = normalize_row({"chosen": messages, "rejected": rejected})
    new = tokenize_pair(row, tokenizer, TokenizeSettings())
    old = tokenize_pair(row, tokenizer, TokenizeSettings(score_position="end_of_turn"))
    assert len(new.chosen) >= len(old.chosen)
    a = score_pairs(model, [new], batch_size=1)
    b = score_pairs(model, [old], batch_size=1)
    if exact:
        assert abs(a[0] - b[0]).max() < 1e-5 and abs(a[1] - b[1]).max() < 1e-5
    assert main(["export", "hf", str(legacy), str(tmp_path / "hf")]) == 0
    assert "end_of_turn" in (tmp_path / "hf" / "README.md").read_text()


def test_pad_equal_to_eos_needs_data_pad_token_and_carries_it_into_the_export(tmp_path, capsys, caplog):
    """Llama-3 style: EOS is <|eot_id|>, the token scores are read at; pad == EOS would be skipped by HF."""
    tok = _llama3_tokenizer()
    tok.eos_token = "<|eot_id|>"
    tok.pad_token = tok.eos_token
    checkpoint = train_tiny_checkpoint(tmp_path / "a", tok)
    assert any("data.pad_token" in r.getMessage() for r in caplog.records)
    capsys.readouterr()
    assert main(["export", "hf", str(checkpoint), str(tmp_path / "hf-a")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "data.pad_token" in err and not (tmp_path / "hf-a").exists()

    checkpoint = train_tiny_checkpoint(tmp_path / "b", tok, "data.pad_token=<|pad|>")
    out = tmp_path / "hf-b"
    capsys.readouterr()
    assert main(["export", "hf", str(checkpoint), str(out)]) == 0
    assert "it/s" not in capsys.readouterr().err  # transformers' progress bars are silenced
    hf_tok = AutoTokenizer.from_pretrained(out)
    config = json.loads((out / "config.json").read_text())
    assert hf_tok.pad_token == "<|pad|>" and config["pad_token_id"] == hf_tok.pad_token_id
    assert config["eos_token_id"] == hf_tok.eos_token_id == hf_tok.convert_tokens_to_ids("<|eot_id|>")
    ours, tokenizer, _meta = load_reward_model(checkpoint)
    hf = AutoModelForSequenceClassification.from_pretrained(out, dtype=torch.float32).eval()
    messages = conversations(4)[3]
    ids = hf_tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    branch = tokenize_branch(tokenizer, messages[:-1], messages[-1:])
    pair = tokenize_pair(
        normalize_row(
            {"chosen": messages, "rejected": [*messages[:-1], {"role": "assistant", "content": "no."}]}
        ),
        tokenizer,
    )
    assert branch.input_ids == list(ids) == pair.chosen.input_ids
    with torch.no_grad():
        plain = hf(input_ids=torch.tensor([ids])).logits[0, 0].item()
    assert abs(plain - score_pairs(ours, [pair], batch_size=1)[0][0]) < 1e-3


def test_unknown_pad_token_is_a_one_line_config_error(tmp_path, capsys):
    argv = ["train", "rm", "model.tiny=tiny-llama", "data.synth={train_rows: 8, eval_rows: 2}"]
    argv += [f"run.run_dir={tmp_path / 'run'}", "data.pad_token=<|nope|>", "run.progress=false"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "data.pad_token" in err
