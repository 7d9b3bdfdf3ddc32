"""Row normalisation: every accepted shape, every row-level reason code, deterministic ids."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardplane.data import reasons as R
from rewardplane.data.normalize import normalize_row
from rewardplane.data.reasons import Rejection
from rewardplane.data.records import PreferencePair


def user(text):
    return {"role": "user", "content": text}


def bot(text):
    return {"role": "assistant", "content": text}


def reason_of(row) -> str:
    with pytest.raises(Rejection) as info:
        normalize_row(row)
    assert info.value.reason == info.value.code
    return info.value.reason


def test_explicit_plain_strings():
    row = {"id": "a", "prompt": "Hi?", "chosen": "Yes.", "rejected": "No."}
    pair = normalize_row(row)
    assert pair == PreferencePair("a", [user("Hi?")], [bot("Yes.")], [bot("No.")], plain_text=True)
    # a normalised plain-text record is written back as TRL's standard row and re-reads the same
    written = {"pair_id": "a", "prompt": "Hi?", "chosen": "Yes.", "rejected": "No.", "margin": None}
    assert pair.to_json() == {**written, "metadata": {}}
    assert normalize_row(pair.to_json()) == pair


def test_only_all_string_rows_are_plain_text():
    """TRL's standard rows (every field a string) are plain text; conversations, HH-RLHF
    transcripts (parsed into turns) and rows mixing strings with messages are not."""
    implicit = normalize_row({"chosen": "abc", "rejected": "xyz"})
    assert implicit.plain_text and implicit.prompt == [] and implicit.texts() == ("", "abc", "xyz")
    assert normalize_row(implicit.to_json()) == implicit
    assert normalize_row({"chosen": "The sky is blue.", "rejected": "The sky is green."}).plain_text
    hh = {"chosen": "\n\nHuman: q\n\nAssistant: a", "rejected": "\n\nHuman: q\n\nAssistant: b"}
    assert not normalize_row(hh).plain_text
    assert not normalize_row({"prompt": "q", "chosen": [bot("a")], "rejected": "b"}).plain_text
    assert not normalize_row({"prompt": [user("q")], "chosen": "a", "rejected": "b"}).plain_text
    conversation = normalize_row({"prompt": [user("q")], "chosen": [bot("a")], "rejected": [bot("b")]})
    assert not conversation.plain_text
    with pytest.raises(ValueError, match="not plain text"):
        conversation.texts()


def test_empty_prompt_string_means_no_prompt():
    assert normalize_row({"prompt": "", "chosen": "a", "rejected": "b"}).prompt == []


def test_trl_conversational_explicit():
    row = {
        "prompt": [{"role": "system", "content": "s"}, user("q")],
        "chosen": [bot("a")],
        "rejected": [bot("b")],
    }
    pair = normalize_row(row)
    assert pair.prompt == row["prompt"] and pair.chosen == [bot("a")] and pair.rejected == [bot("b")]


def test_trl_standard_implicit_prompt_is_extracted_as_trl_does():
    pair = normalize_row({"chosen": "The sky is blue.", "rejected": "The sky is green."})
    assert pair.prompt == [{"role": "user", "content": "The sky is"}] and pair.chosen == [bot(" blue.")]
    assert normalize_row({"chosen": "abc", "rejected": "xyz"}).prompt == []


def test_ultrafeedback_binarized_shape():
    row = {
        "prompt": "Name a fruit.",
        "prompt_id": "uf-1",
        "chosen": [user("Name a fruit."), bot("kiwi")],
        "rejected": [user("Name a fruit."), bot("red")],
        "messages": [user("Name a fruit."), bot("kiwi")],
        "score_chosen": 8.0,
        "score_rejected": 3.5,
    }
    pair = normalize_row(row)
    assert pair.pair_id == "uf-1"
    assert pair.prompt == [user("Name a fruit.")]
    assert (pair.chosen, pair.rejected) == ([bot("kiwi")], [bot("red")])
    assert pair.metadata == {"score_chosen": 8.0, "score_rejected": 3.5}
    assert pair.margin is None


def test_ultrafeedback_prefix_must_match_prompt():
    row = {"prompt": "Name a fruit.", "chosen": [user("Other?"), bot("kiwi")], "rejected": [bot("red")]}
    assert reason_of(row) == R.PROMPT_MISMATCH


def test_hh_rlhf_transcripts_multi_turn():
    chosen = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Name a fruit.\n\nAssistant: kiwi"
    rejected = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Name a fruit.\n\nAssistant: red"
    pair = normalize_row({"chosen": chosen, "rejected": rejected})
    assert pair.prompt == [user("Hi"), bot("Hello!"), user("Name a fruit.")]
    assert (pair.chosen, pair.rejected) == ([bot("kiwi")], [bot("red")])


def test_implicit_multi_turn_shared_prefix():
    history = [{"role": "system", "content": "s"}, user("a"), bot("b"), user("c")]
    pair = normalize_row({"chosen": [*history, bot("yes")], "rejected": [*history, bot("no")], "margin": 2})
    assert pair.prompt == history and pair.margin == 2.0


@pytest.mark.parametrize(
    ("chosen", "rejected"),
    [
        (
            [user("a"), bot("b"), user("c"), bot("d")],
            [user("a"), bot("x"), user("c"), bot("d")],
        ),  # diverge early
        ([user("a"), bot("b")], [user("a"), bot("b"), user("c"), bot("d")]),  # one is a prefix
        ([user("a"), bot("b"), bot("c")], [user("a"), bot("x")]),  # two assistant turns on one side
        ([user("q"), bot("b")], [user("other"), bot("b")]),  # different prompts
    ],
)
def test_implicit_prompt_mismatch(chosen, rejected):
    assert reason_of({"chosen": chosen, "rejected": rejected}) == R.PROMPT_MISMATCH


def test_implicit_must_end_with_assistant():
    assert reason_of({"chosen": [user("a"), user("b")], "rejected": [user("a"), user("c")]}) == R.BAD_ROLE


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (["not", "an", "object"], R.SCHEMA),
        ("a string", R.SCHEMA),
        ({"prompt": 3, "chosen": "a", "rejected": "b"}, R.SCHEMA),
        ({"chosen": {"text": "a"}, "rejected": "b"}, R.SCHEMA),
        ({"chosen": [bot("a")], "rejected": "b"}, R.SCHEMA),
        ({"id": True, "chosen": "a", "rejected": "b"}, R.SCHEMA),
        ({"id": "", "chosen": "a", "rejected": "b"}, R.SCHEMA),
        ({"chosen": "a", "rejected": "b", "margin": "1.0"}, R.SCHEMA),
        ({"chosen": "a", "rejected": "b", "metadata": [1]}, R.SCHEMA),
        ({"chosen": "a", "rejected": "b", "metadata": {"x": math.nan}}, R.SCHEMA),
        ({"chosen": "a", "rejected": "b", "metadata": {"x": {"y": [math.inf]}}}, R.SCHEMA),
        ({"chosen": "\n\nHuman: q\n\nAssistant: a", "rejected": "plain"}, R.SCHEMA),
        ({"prompt": [user("q"), "loose text"], "chosen": "a", "rejected": "b"}, R.SCHEMA),
        ({"prompt": "q", "completion": "a", "label": True}, R.SCHEMA),
        ({"prompt": "q", "chosen": "a"}, R.MISSING_FIELD),
        ({"prompt": "q", "rejected": "a"}, R.MISSING_FIELD),
        ({"prompt": "q", "chosen": "a", "rejected": None}, R.MISSING_FIELD),
        ({"prompt": [{"content": "q"}], "chosen": "a", "rejected": "b"}, R.MISSING_FIELD),
        ({"prompt": [{"role": "user"}], "chosen": "a", "rejected": "b"}, R.MISSING_FIELD),
        ({"prompt": [{"role": "robot", "content": "q"}], "chosen": "a", "rejected": "b"}, R.BAD_ROLE),
        ({"prompt": [{"role": ["user"], "content": "q"}], "chosen": "a", "rejected": "b"}, R.BAD_ROLE),
        ({"prompt": "q", "chosen": [bot("a"), user("more")], "rejected": "b"}, R.BAD_ROLE),
        (
            {"prompt": [user([{"type": "text", "text": "q"}])], "chosen": "a", "rejected": "b"},
            R.NON_TEXT_CONTENT,
        ),
        (
            {"prompt": "q", "chosen": [{"role": "assistant", "content": 42}], "rejected": "b"},
            R.NON_TEXT_CONTENT,
        ),
        ({"prompt": "q", "chosen": "", "rejected": "b"}, R.EMPTY_COMPLETION),
        ({"prompt": "q", "chosen": "a", "rejected": " \n "}, R.EMPTY_COMPLETION),
        ({"prompt": "q", "chosen": [], "rejected": "b"}, R.EMPTY_COMPLETION),
        (
            {"chosen": "\n\nHuman: q\n\nAssistant:", "rejected": "\n\nHuman: q\n\nAssistant: b"},
            R.EMPTY_COMPLETION,
        ),
        ({"prompt": "q", "chosen": "same", "rejected": "same"}, R.IDENTICAL),
        ({"chosen": [user("q"), bot("x")], "rejected": [user("q"), bot("x")]}, R.IDENTICAL),
        ({"prompt": "q", "chosen": "a", "rejected": "b", "margin": math.nan}, R.NON_FINITE_MARGIN),
        ({"prompt": "q", "chosen": "a", "rejected": "b", "margin": -math.inf}, R.NON_FINITE_MARGIN),
    ],
)
def test_row_level_reasons(row, reason):
    assert reason_of(row) == reason


def test_rejection_keeps_explicit_id():
    with pytest.raises(Rejection) as info:
        normalize_row({"id": 7, "prompt": "q", "chosen": "a", "rejected": "a"})
    assert info.value.pair_id == "7"
    assert info.value.to_json() == {
        "source_index": None,
        "pair_id": "7",
        "reason": "identical",
        "message": "chosen and rejected are identical",
    }


def test_unknown_reason_code_is_a_programming_error():
    with pytest.raises(ValueError):
        Rejection("typo", "x")


def test_messages_keep_only_role_and_content():
    row = {"prompt": [{"role": "user", "content": "q", "name": "x"}], "chosen": "a", "rejected": "b"}
    assert normalize_row(row).prompt == [user("q")]


def test_null_fields_count_as_absent():
    pair = normalize_row(
        {"id": None, "prompt": "q", "chosen": "a", "rejected": "b", "margin": None, "metadata": None}
    )
    assert pair.margin is None and pair.metadata == {}
    assert pair == normalize_row({"prompt": "q", "chosen": "a", "rejected": "b"})


def test_id_priority_and_derived_ids():
    row = {"prompt": "q", "chosen": "a", "rejected": "b", "metadata": {"subset": "s"}}
    assert normalize_row({**row, "pair_id": "p", "id": "i", "prompt_id": "x"}).pair_id == "p"
    assert normalize_row({**row, "id": "i", "prompt_id": "x"}).pair_id == "i"
    derived = normalize_row(row).pair_id
    assert len(derived) == 64 and derived == normalize_row(dict(reversed(row.items()))).pair_id
    # the same content in another shape gives the same id; different content a different one
    assert normalize_row({**row, "prompt": [user("q")], "chosen": [bot("a")]}).pair_id == derived
    assert normalize_row({**row, "rejected": "c"}).pair_id != derived
    assert normalize_row({**row, "margin": 1.0}).pair_id != derived


text = st.text(min_size=1, max_size=30).filter(lambda s: s.strip())
message = st.builds(
    lambda role, content: {"role": role, "content": content},
    st.sampled_from(["system", "user", "assistant"]),
    st.text(max_size=20),
)
pairs = st.builds(
    lambda pid, prompt, chosen, rejected, margin, subset: PreferencePair(
        pid,
        prompt,
        [bot(chosen)],
        [bot(rejected + "!")] if rejected == chosen else [bot(rejected)],
        margin,
        {} if subset is None else {"subset": subset},
    ),
    st.text(min_size=1, max_size=10),
    st.lists(message, max_size=4),
    text,
    text,
    st.none() | st.floats(allow_nan=False, allow_infinity=False),
    st.none() | st.text(max_size=5),
)

plain_pairs = st.builds(
    lambda pid, prompt, chosen, rejected, margin: PreferencePair(
        pid,
        [user(prompt)] if prompt else [],
        [bot(chosen)],
        [bot(rejected + "!")] if rejected == chosen else [bot(rejected)],
        margin,
        plain_text=True,
    ),
    st.text(min_size=1, max_size=10),
    st.text(max_size=20),
    text,
    text,
    st.none() | st.floats(allow_nan=False, allow_infinity=False),
)


@settings(max_examples=60, deadline=None)
@given(pairs | plain_pairs)
def test_round_trip_of_normalised_records(pair):
    """A normalised record, written as JSON, reads back as exactly the same record."""
    assert normalize_row(pair.to_json()) == pair


@settings(max_examples=60, deadline=None)
@given(st.lists(message, max_size=3), text, text)
def test_implicit_and_explicit_shapes_agree(history, chosen, rejected):
    if chosen == rejected:
        rejected += "!"
    implicit = normalize_row({"chosen": [*history, bot(chosen)], "rejected": [*history, bot(rejected)]})
    explicit = normalize_row({"prompt": history, "chosen": [bot(chosen)], "rejected": [bot(rejected)]})
    assert implicit == explicit


def test_type_names_take_their_article():
    """'content is an array', never 'a array' (issue 47)."""
    from rewardplane.data.reasons import Rejection

    row = {"chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ["x"]}],
           "rejected": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "y"}]}  # fmt: skip
    with pytest.raises(Rejection, match="content is an array, not text"):
        normalize_row(row)
    with pytest.raises(Rejection, match="row is a JSON string"):
        normalize_row("text")
