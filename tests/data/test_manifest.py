"""`prepare`: a reproducible, order-independent split with a byte-identical manifest."""

from __future__ import annotations

import json

import pytest

from rewardplane.core.errors import UsageError
from rewardplane.data.manifest import prepare, split_rank
from rewardplane.data.synth import builtin_tokenizer, corrupt_rows, generate_rows


def write_rows(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def read_ids(path):
    return [json.loads(line)["pair_id"] for line in path.read_text().splitlines()]


@pytest.fixture()
def source(tmp_path):
    rows = generate_rows(120, seed=4) + [row for _, row in corrupt_rows(1)]
    return write_rows(tmp_path / "in.jsonl", rows)


def test_split_is_by_rank_without_overlap(tmp_path, source):
    manifest = prepare(source, tmp_path / "out", eval_size=20, seed_key="k")
    out = tmp_path / "out"
    train, eval_ = read_ids(out / "train.jsonl"), read_ids(out / "eval.jsonl")
    assert len(eval_) == 20 and len(train) == manifest["counts"]["valid"] - 20
    assert not set(train) & set(eval_)
    ranked = sorted(train + eval_, key=lambda pid: split_rank("k", pid))
    assert eval_ == ranked[:20]  # eval is the first N by rank, written in rank order
    assert sorted(out.iterdir()) == sorted(
        out / n for n in ("train.jsonl", "eval.jsonl", "rejects.jsonl", "manifest.json")
    )
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert manifest["counts"]["rejected"] == len(rejects) == sum(manifest["rejections"].values())
    assert set(rejects[0]) == {"source_index", "pair_id", "reason", "message"}


def test_manifest_is_byte_identical_across_runs(tmp_path, source):
    tok = builtin_tokenizer()
    for name in ("a", "b"):
        prepare(source, tmp_path / name, eval_size=15, seed_key="k", tokenizer=tok, tokenizer_name="builtin")
    for name in ("manifest.json", "train.jsonl", "eval.jsonl", "rejects.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["tokenizer"]["settings"]["truncation"] == "drop"
    assert manifest["rejections"]["oversize"] == 2
    assert manifest["input"]["name"] == "in.jsonl" and len(manifest["input"]["sha256"]) == 64


def test_split_does_not_depend_on_input_order_and_key_changes_it(tmp_path):
    rows = generate_rows(80, seed=9)
    prepare(write_rows(tmp_path / "a.jsonl", rows), tmp_path / "a", eval_size=10, seed_key="k")
    prepare(write_rows(tmp_path / "b.jsonl", rows[::-1]), tmp_path / "b", eval_size=10, seed_key="k")
    prepare(write_rows(tmp_path / "c.jsonl", rows), tmp_path / "c", eval_size=10, seed_key="other")
    eval_a = (tmp_path / "a" / "eval.jsonl").read_bytes()
    assert eval_a == (tmp_path / "b" / "eval.jsonl").read_bytes()
    assert eval_a != (tmp_path / "c" / "eval.jsonl").read_bytes()
    assert read_ids(tmp_path / "b" / "train.jsonl") == read_ids(tmp_path / "a" / "train.jsonl")[::-1]


def test_bad_split_arguments_leave_no_output(tmp_path, source):
    with pytest.raises(UsageError, match="exceeds"):
        prepare(source, tmp_path / "out", eval_size=10_000, seed_key="k")
    assert not (tmp_path / "out").exists()
    with pytest.raises(UsageError):
        prepare(source, tmp_path / "out", eval_size=-1, seed_key="k")
    with pytest.raises(UsageError):
        prepare(source, tmp_path / "out", eval_size=1, seed_key="")
    assert prepare(source, tmp_path / "out", eval_size=0, seed_key="k")["counts"]["eval"] == 0


def _hh(opening: str, reply: str, other: str) -> dict:
    return {
        "chosen": f"\n\nHuman: {opening}\n\nAssistant: {reply}",
        "rejected": f"\n\nHuman: {opening}\n\nAssistant: {other}",
    }


def _branching_rows() -> list[dict]:
    """HH-style conversations that share openings: three turns deep, several per opening."""
    rows = []
    for q in range(12):
        for follow in range(q % 4 + 1):
            rows.append(
                {
                    "chosen": f"\n\nHuman: question {q}\n\nAssistant: answer\n\nHuman: more {follow}"
                    f"\n\nAssistant: good {q}.{follow}",
                    "rejected": f"\n\nHuman: question {q}\n\nAssistant: answer\n\nHuman: more {follow}"
                    f"\n\nAssistant: bad {q}.{follow}",
                }
            )
    return rows


def _openings(path):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [next(m["content"] for m in r["prompt"] if m["role"] == "user") for r in rows]


@pytest.mark.parametrize("eval_size", [1, 5, 9])
def test_split_by_first_turn_keeps_each_opening_on_one_side(tmp_path, eval_size):
    manifest = prepare(
        write_rows(tmp_path / "in.jsonl", _branching_rows()),
        tmp_path / "out",
        eval_size=eval_size,
        seed_key="k",
        split_by="first_turn",
    )
    train, eval_ = _openings(tmp_path / "out" / "train.jsonl"), _openings(tmp_path / "out" / "eval.jsonl")
    assert not set(train) & set(eval_)
    assert manifest["counts"]["eval"] == len(eval_) >= eval_size  # the boundary group goes whole
    assert manifest["counts"]["train"] == len(train) == manifest["counts"]["valid"] - len(eval_)
    assert manifest["split"]["by"] == "first_turn"


def test_split_by_pair_is_unchanged_and_splits_openings(tmp_path):
    """The default still ranks pair by pair (the manifest has no `by`), which puts branches of
    one conversation on both sides: the reason for `first_turn`."""
    manifest = prepare(
        write_rows(tmp_path / "in.jsonl", _branching_rows()), tmp_path / "o", eval_size=9, seed_key="k"
    )
    assert "by" not in manifest["split"]
    assert set(_openings(tmp_path / "o" / "train.jsonl")) & set(_openings(tmp_path / "o" / "eval.jsonl"))


def test_split_by_prompt_groups_identical_prompts(tmp_path):
    rows = [_hh("same", f"yes {i}", f"no {i}") for i in range(5)] + [
        _hh(f"q{i}", "y", "n") for i in range(10)
    ]
    prepare(
        write_rows(tmp_path / "in.jsonl", rows), tmp_path / "o", eval_size=3, seed_key="k", split_by="prompt"
    )
    train, eval_ = _openings(tmp_path / "o" / "train.jsonl"), _openings(tmp_path / "o" / "eval.jsonl")
    assert ("same" in train) != ("same" in eval_)


def test_unknown_split_by_is_refused(tmp_path, source):
    with pytest.raises(UsageError, match="--split-by"):
        prepare(source, tmp_path / "out", eval_size=1, seed_key="k", split_by="row")
