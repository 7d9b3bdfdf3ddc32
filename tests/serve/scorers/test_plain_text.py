"""Plain-string items are served as the model was trained to read plain text (issue 24).

A reward model trained on TRL's standard rows (`plain_text: text_eos`: no chat template, the text
plus EOS) must be served on exactly those ids: the served score of a string prompt + string
response equals `rewardplane eval`'s score of the same plain-text pair's chosen branch and a plain
transformers forward on `tok(prompt + response + eos)`. Checkpoints trained before issue 24
(`chat_template`) keep their chat-template scores, message items keep the chat template, and an
export serves as the checkpoint it came from. References are transformers forwards and TRL's own
dataset preparation, never a re-implementation of the tokenisation.
"""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rewardplane.cli import main
from rewardplane.core.errors import ConfigError
from rewardplane.data.synth import builtin_tokenizer
from rewardplane.serve.admission import admitted
from rewardplane.serve.protocol import RAW_TEXT, ItemError, ScoreItem
from rewardplane.serve.scorers.common import as_messages
from rewardplane.serve.scorers.registry import ScorerSpec, build_scorer
from support.rm import train_tiny_checkpoint

torch.set_num_threads(1)  # 2 shared cores: intra-op threads only contend for these tiny models

TOL = 1e-5

PLAIN = [
    ("Name a fruit.", " kiwi and plum."),
    ("Name some fruit", "s: kiwi."),  # "fruit" + "s" can merge across the boundary
    ("Q: 2+2? A:", " 4"),
    ("", "an empty prompt."),
    ("Déjà vu?", " Oui, ça arrive. ☕"),
    ("Name a fruit.", " red.<|eos|>"),  # already ends with EOS: TRL adds no second one
]
MESSAGES = [
    ([{"role": "user", "content": "Name a fruit."}], " kiwi."),
    ("Name a fruit.", [{"role": "assistant", "content": "kiwi."}]),
    (
        [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi!"}],
        [{"role": "assistant", "content": "Hello there."}],
    ),
]


def _bos_tokenizer():
    """The built-in tokenizer with a Llama-style post-processor: `tokenizer(text)` adds BOS, so the
    ids of TRL's plain text differ from the chat template's in their special tokens too."""
    from tokenizers import processors

    tok = copy.deepcopy(builtin_tokenizer())  # builtin_tokenizer() is one shared, cached object
    bos = tok.bos_token
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.bos_token_id)]
    )
    return tok


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(text_eos checkpoint, its legacy twin without `plain_text`, the export of each, root)."""
    root = tmp_path_factory.mktemp("plain")
    checkpoint = train_tiny_checkpoint(root, _bos_tokenizer(), "run.max_steps=2", "optim.lr=3e-3")
    legacy = root / "legacy"
    shutil.copytree(checkpoint, legacy)
    meta = json.loads((legacy / "rewardplane.json").read_text())
    del meta["plain_text"]  # as written before issue 24: plain-text rows went through the template
    (legacy / "rewardplane.json").write_text(json.dumps(meta))
    for source, out in ((checkpoint, root / "hf"), (legacy, root / "hf-legacy")):
        assert main(["export", "hf", str(source), str(out)]) == 0
    return checkpoint, legacy, root


def scorer(path, kind: str = "rm", **options):
    s = build_scorer(ScorerSpec(name="s", kind=kind, path=str(path), device="cpu", options=options))
    s.load()
    return s


def items(pairs) -> list[ScoreItem]:
    return [ScoreItem(str(k), prompt, response) for k, (prompt, response) in enumerate(pairs)]


def trl_text(tok, prompt: str, response: str) -> str:
    """The model card's recipe: prompt + response, EOS appended unless it ends with it."""
    text = prompt + response
    return text if text.endswith(tok.eos_token) else text + tok.eos_token


def hf_scores(path, ids_list) -> list[float]:
    """A plain transformers forward per sequence (a rewardplane checkpoint is an HF seqcls dir)."""
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return [model(input_ids=torch.tensor([ids])).logits[0, 0].item() for ids in ids_list]


def test_a_text_eos_checkpoint_serves_plain_text_as_eval_trl_and_transformers_score_it(trained, tmp_path):
    from rewardplane.data.probe import freeze_probe
    from rewardplane.data.tokenize import TokenizeSettings
    from rewardplane.eval.artifacts import read_pairs
    from rewardplane.eval.runner import tokenize_eval_data
    from support.trl_data import trl_reward_ids

    checkpoint, _legacy, _root = trained
    assert json.loads((checkpoint / "rewardplane.json").read_text())["plain_text"] == "text_eos"
    tok = AutoTokenizer.from_pretrained(checkpoint)
    s = scorer(checkpoint)
    assert s.info().extra["plain_text"] == "text_eos"
    batch = items(PLAIN)
    prepared = s.prepare_many(batch)
    served = s.score_prepared(prepared)

    # the ids: the model card's recipe, and TRL's RewardTrainer's own
    rows = [
        {"id": f"p{k}", "prompt": p, "chosen": r, "rejected": " nothing at all."}
        for k, (p, r) in enumerate(PLAIN)
    ]
    recipe = [tok(trl_text(tok, p, r))["input_ids"] for p, r in PLAIN]
    assert prepared == recipe
    assert prepared == [chosen for chosen, _ in trl_reward_ids(rows, tok)]
    assert all(ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id for ids in prepared)
    assert [s.prepare(i) for i in batch] == prepared  # alone or in a request: the same ids

    # the scores: a plain transformers forward on those ids ...
    assert served == pytest.approx(hf_scores(checkpoint, recipe), abs=TOL)
    # ... and `rewardplane eval` of the plain-text pairs, their chosen branch
    data = tmp_path / "plain.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    settings = TokenizeSettings(max_length=128, max_completion_length=64)
    probe = freeze_probe(tokenize_eval_data(data, tok, settings), tok, settings)
    (tmp_path / "probe.json").write_text(json.dumps(probe))
    argv = ["eval", "--model", str(checkpoint), "--probe", str(tmp_path / "probe.json"), "--data", str(data)]
    assert main([*argv, "--out", str(tmp_path / "eval"), "--replicates", "50", "--no-progress"]) == 0
    evaluated = {r["pair_id"]: r["chosen_score"] for r in read_pairs(tmp_path / "eval" / "pairs.jsonl")}
    assert served == pytest.approx([evaluated[row["id"]] for row in rows], abs=TOL)


def test_text_eos_truncates_as_the_scorer_does_and_keeps_its_item_errors(trained):
    checkpoint, _legacy, _root = trained
    tok = AutoTokenizer.from_pretrained(checkpoint)
    s = scorer(checkpoint, max_length=12, empty_response=-2.0)
    long_prompt = ("Name a fruit, any fruit at all. " * 4, " kiwi.")
    full = tok(trl_text(tok, *long_prompt))["input_ids"]
    assert len(full) > 12
    batch = items([long_prompt, ("Hi.", " kiwi " * 20), ("Hi.", "  ")])
    got = admitted(s, batch, s.prepare_many)  # the admission contract first, as the service does
    assert got[0] == full[-12:]  # the oldest tokens cut, the EOS kept
    assert isinstance(got[1], ItemError) and got[1].code == "too_long"  # a response alone too long
    assert got[2] == -2.0  # empty_response handling is unchanged
    assert s.score_prepared(got[:1]) == pytest.approx(hf_scores(checkpoint, [full[-12:]]), abs=TOL)


def test_a_legacy_checkpoint_keeps_its_chat_template_scores(trained):
    from rewardplane.data.tokenize import tokenize_branch

    checkpoint, legacy, _root = trained
    tok = AutoTokenizer.from_pretrained(legacy)
    s = scorer(legacy)
    assert s.info().extra["plain_text"] == "chat_template"
    batch = items(PLAIN[:3])
    prepared = s.prepare_many(batch)
    conversation = [
        tokenize_branch(tok, as_messages(i.prompt, "user"), as_messages(i.response, "assistant")).input_ids
        for i in batch
    ]
    assert prepared == conversation
    assert s.score_prepared(prepared) == pytest.approx(hf_scores(legacy, conversation), abs=TOL)
    # an explicit chat_template is the same scorer; the text_eos twin (same weights) is not
    explicit = scorer(legacy, plain_text="chat_template")
    assert explicit.info().identity == s.info().identity
    assert scorer(checkpoint).info().identity != s.info().identity


def test_the_option_overrides_where_nothing_is_recorded_and_a_contradiction_is_refused(trained, tmp_path):
    checkpoint, legacy, root = trained
    for path, option, recorded in (
        (checkpoint, "chat_template", "text_eos"),
        (legacy, "text_eos", "chat_template"),
    ):
        with pytest.raises(ConfigError) as refused:
            scorer(path, plain_text=option)
        message = str(refused.value)
        assert "\n" not in message and f"options.plain_text is {option!r}" in message
        assert f"tokenised as {recorded!r}" in message and str(path) in message
    same = scorer(checkpoint, plain_text="text_eos")  # agreeing with the record is fine
    assert same.info().identity == scorer(checkpoint).info().identity
    with pytest.raises(
        ConfigError, match="options.plain_text: .trl. is not one of .text_eos. or .chat_template."
    ):
        build_scorer(ScorerSpec(name="s", kind="rm", path=str(checkpoint), options={"plain_text": "trl"}))

    # a Hugging Face directory records nothing: chat_template, as hf_seqcls always served strings
    bare = tmp_path / "bare"
    shutil.copytree(root / "hf", bare)
    (bare / "rewardplane_export.json").unlink()
    tok = AutoTokenizer.from_pretrained(bare)
    default, override = scorer(bare, kind="hf_seqcls"), scorer(bare, kind="hf_seqcls", plain_text="text_eos")
    assert default.info().extra["plain_text"] == "chat_template"
    assert override.info().extra["plain_text"] == "text_eos"
    assert default.info().identity != override.info().identity
    recipe = [tok(trl_text(tok, p, r))["input_ids"] for p, r in PLAIN]
    assert override.prepare_many(items(PLAIN)) == recipe
    assert default.prepare_many(items(PLAIN)) != recipe
    assert override.score_batch(items(PLAIN)) == pytest.approx(hf_scores(bare, recipe), abs=TOL)
    # the named shapes record nothing either
    shape = build_scorer(ScorerSpec(name="t", kind="hf_seqcls", shape="tiny-text-rm", device="cpu"))
    shape.load()
    assert shape.plain_text == "chat_template"


def test_message_items_keep_the_chat_template_and_text_eos_items_bypass_the_prompt_cache(trained):
    from rewardplane.data.tokenize import tokenize_branch

    checkpoint, legacy, _root = trained
    text_eos, chat = scorer(checkpoint), scorer(legacy)
    tok = text_eos.tokenizer
    conversations = items(MESSAGES)
    got = text_eos.prepare_many(conversations)
    assert got == chat.prepare_many(conversations)
    assert got == [
        tokenize_branch(tok, as_messages(i.prompt, "user"), as_messages(i.response, "assistant")).input_ids
        for i in conversations
    ]
    # a request mixing both: every item as alone; the raw OpenRLHF path keeps its own reading
    # (its turn completed: the checkpoint records template_end, so complete_turn is on)
    raw = ScoreItem("raw", "", "<|im_start|>user\nHi<|im_end|>", metadata={RAW_TEXT: True})
    mixed = [*items(PLAIN[:2]), *conversations, raw]
    fresh = scorer(checkpoint)
    together = fresh.prepare_many(mixed)
    assert together == [fresh.prepare(i) for i in mixed]
    assert together[-1] == tok(raw.response + "\n", add_special_tokens=False)["input_ids"]
    # only the conversations rendered a prompt (3 distinct), the plain items none
    only_plain = scorer(checkpoint)
    only_plain.prepare_many(items(PLAIN))
    assert (len(only_plain.prompts), only_plain.prompts.hits, only_plain.prompts.misses) == (0, 0, 0)
    assert len(fresh.prompts) == 3
    # "Name a fruit." is cached as a user turn by the conversation item; a plain item with the
    # same prompt is not read from that cache
    assert fresh.prepare(items(PLAIN[:1])[0]) == tok(trl_text(tok, *PLAIN[0]))["input_ids"]


def test_an_export_serves_as_the_checkpoint_it_came_from(trained):
    from rewardplane.models.loading import load_reward_model

    checkpoint, legacy, root = trained
    assert json.loads((root / "hf" / "rewardplane_export.json").read_text())["plain_text"] == "text_eos"
    assert (
        json.loads((root / "hf-legacy" / "rewardplane_export.json").read_text())["plain_text"]
        == "chat_template"
    )
    batch = items([*PLAIN, *MESSAGES])
    for source, export, mode in (
        (checkpoint, root / "hf", "text_eos"),
        (legacy, root / "hf-legacy", "chat_template"),
    ):
        reference = scorer(source).score_batch(batch)
        # hf_seqcls on the checkpoint directory itself reads its rewardplane.json too
        for path, kind in ((source, "hf_seqcls"), (export, "hf_seqcls"), (export, "rm")):
            served = scorer(path, kind=kind)
            assert served.info().extra["plain_text"] == mode
            assert served.score_batch(batch) == pytest.approx(reference, abs=TOL)
        assert load_reward_model(export)[2]["plain_text"] == mode  # and eval reads it too
    with pytest.raises(ConfigError, match="tokenised as 'text_eos'"):
        scorer(root / "hf", kind="hf_seqcls", plain_text="chat_template")


def test_complete_turn_is_on_where_the_directory_records_template_end(trained, tmp_path):
    """OpenRLHF's raw query stops at the policy's end-of-turn text; a model trained at
    `template_end` is read after the template's suffix ("\\n" for ChatML). On by default where the
    directory records template_end (a checkpoint, an export), off where it records end_of_turn or
    nothing (a bare Hugging Face directory); the option overrides either way."""
    from rewardplane.data.builtin_tokenizer import build_tokenizer

    checkpoint, _legacy, root = trained
    bare = tmp_path / "bare"
    shutil.copytree(root / "hf", bare)
    (bare / "rewardplane_export.json").unlink()
    eot = tmp_path / "eot"
    shutil.copytree(checkpoint, eot)
    meta = json.loads((eot / "rewardplane.json").read_text())
    del meta["score_position"]  # as written before issue 24: read at the end-of-turn marker
    (eot / "rewardplane.json").write_text(json.dumps(meta))
    text = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>"
    raw = ScoreItem("raw", "", text, metadata={RAW_TEXT: True})
    cases = [
        (checkpoint, "rm", {}, True),
        (root / "hf", "hf_seqcls", {}, True),
        (bare, "hf_seqcls", {}, False),
        (eot, "rm", {}, False),
        (checkpoint, "rm", {"complete_turn": False}, False),
        (bare, "hf_seqcls", {"complete_turn": True}, True),
    ]
    for path, kind, options, on in cases:
        s = scorer(path, kind, **options)
        assert s.info().extra["complete_turn"] is on, (path.name, options)
        want = s.tokenizer(text + ("\n" if on else ""), add_special_tokens=False)["input_ids"]
        assert s.prepare(raw) == want, (path.name, options)
        done = ScoreItem("done", "", text + "\n", metadata={RAW_TEXT: True})  # already complete
        assert s.prepare(done) == s.tokenizer(text + "\n", add_special_tokens=False)["input_ids"]
    assert scorer(checkpoint).info().identity != scorer(checkpoint, complete_turn=False).info().identity
    plain = tmp_path / "plain-tok"
    build_tokenizer(["Hello there."] * 4, vocab_size=300, chat_template=False).save_pretrained(plain)
    spec = ScorerSpec(
        name="s",
        kind="hf_seqcls",
        shape="tiny-text-rm",
        device="cpu",
        options={"complete_turn": True, "tokenizer": str(plain)},
    )
    with pytest.raises(ConfigError, match="options.complete_turn needs a chat template"):
        build_scorer(spec).load()
