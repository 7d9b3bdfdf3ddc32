"""TRL data as it is: implicit-prompt rows and Hub-format folders, in every data command and in training."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rewardplane.cli import main
from rewardplane.data import reasons as R
from rewardplane.data.normalize import extract_text_prompt, normalize_row
from rewardplane.data.reader import detect_format, input_files, iter_pairs, iter_rows
from rewardplane.data.synth import generate_rows

IMPLICIT_TEXT = {"chosen": "The sky is blue.", "rejected": "The sky is green."}
IMPLICIT_MESSAGES = {
    "chosen": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Sky colour?"},
        {"role": "assistant", "content": "Blue."},
    ],
    "rejected": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Sky colour?"},
        {"role": "assistant", "content": "Green."},
    ],
}


def _trl_extract_prompt(example):
    """TRL's `extract_prompt` (trl.data_utils), copied: the reference the split is checked against."""
    for idx in range(min(len(example["chosen"]), len(example["rejected"]))):
        if example["chosen"][idx] != example["rejected"][idx]:
            if example["chosen"][idx - 1] == " ":
                idx -= 1
            break
    return {
        "prompt": example["chosen"][:idx],
        "chosen": example["chosen"][idx:],
        "rejected": example["rejected"][idx:],
    }


@pytest.mark.parametrize(
    ("chosen", "rejected"),
    [
        ("The sky is blue.", "The sky is green."),
        ("Q: 2+2? A: 4", "Q: 2+2? A: 5"),
        ("abc", "abcd"),
        ("hello world", "help"),
        ("x", "y z"),
    ],
)
def test_text_prompt_is_split_exactly_as_trl_splits_it(chosen, rejected):
    expected = _trl_extract_prompt({"chosen": chosen, "rejected": rejected})
    assert extract_text_prompt(chosen, rejected) == (
        expected["prompt"],
        expected["chosen"],
        expected["rejected"],
    )


def test_implicit_rows_normalise():
    pair = normalize_row(IMPLICIT_TEXT)
    assert pair.prompt == [{"role": "user", "content": "The sky is"}]
    assert pair.chosen == [{"role": "assistant", "content": " blue."}]
    pair = normalize_row(IMPLICIT_MESSAGES)
    assert pair.prompt == IMPLICIT_MESSAGES["chosen"][:2]
    assert pair.chosen == [{"role": "assistant", "content": "Blue."}]
    # no shared prefix at all: an empty prompt
    pair = normalize_row(
        {
            "chosen": [{"role": "assistant", "content": "a"}],
            "rejected": [{"role": "assistant", "content": "b"}],
        }
    )
    assert pair.prompt == []


BAD_ROWS = [
    ({"chosen": "same", "rejected": "same"}, R.IDENTICAL),
    ({"chosen": "text", "rejected": [{"role": "assistant", "content": "x"}]}, R.SCHEMA),
    ({"chosen": "x"}, R.MISSING_FIELD),
    (
        {"chosen": [{"role": "user", "content": "q"}], "rejected": [{"role": "user", "content": "r"}]},
        R.BAD_ROLE,
    ),
]


def _rows_file(tmp_path, rows):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("command", ["validate", "prepare", "freeze-probe"])
def test_data_commands_read_implicit_rows_with_a_tokenizer(tmp_path, capsys, command):
    rows = [
        IMPLICIT_TEXT,
        IMPLICIT_MESSAGES,
        {"chosen": "abc", "rejected": "xyz"},  # no common prefix: empty prompt
        {
            "chosen": [{"role": "assistant", "content": "hi"}],
            "rejected": [{"role": "assistant", "content": "no"}],
        },
    ]
    path = _rows_file(tmp_path, rows)
    argv = ["data", command, str(path), "--tokenizer", "builtin"]
    if command == "prepare":
        argv += ["--out", str(tmp_path / "out"), "--eval-size", "1", "--seed-key", "k"]
    elif command == "freeze-probe":
        argv += ["--out", str(tmp_path / "probe.json")]
    assert main(argv) == 0, capsys.readouterr().err
    if command == "freeze-probe":
        assert json.loads((tmp_path / "probe.json").read_text())["count"] == 4


def test_bad_implicit_rows_keep_their_reason_codes(tmp_path, capsys):
    path = _rows_file(tmp_path, [IMPLICIT_TEXT] + [row for row, _ in BAD_ROWS])
    report = tmp_path / "rejects.jsonl"
    assert main(["data", "validate", str(path), "--tokenizer", "builtin", "--report", str(report)]) == 1
    reasons = [json.loads(line)["reason"] for line in report.read_text().splitlines()]
    assert reasons == [reason for _, reason in BAD_ROWS]


# ---- Hub-format folders --------------------------------------------------------------------------
def _table_rows(n, seed):
    """Rows with one schema (Arrow / Parquet need that): TRL conversational, explicit prompt."""
    return [
        {
            "prompt": [{"role": "user", "content": f"Name a fruit ({seed}-{i})."}],
            "chosen": [{"role": "assistant", "content": f"kiwi {i}"}],
            "rejected": [{"role": "assistant", "content": f"red {i}"}],
        }
        for i in range(n)
    ]


def _contents(path):
    return [p.to_json() for p in iter_pairs(path)]


def test_parquet_shard_folder_reads_each_split_in_shard_order(tmp_path):
    root = tmp_path / "repo"
    (root / "data").mkdir(parents=True)
    train, test = _table_rows(10, 0), _table_rows(4, 1)
    pq.write_table(pa.Table.from_pylist(train[:6]), root / "data" / "train-00000-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(train[6:]), root / "data" / "train-00001-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(test), root / "data" / "test-00000-of-00001.parquet")
    (root / "README.md").write_text("---\nlicense: mit\n---\n")
    assert detect_format(root) == "hf_dir"
    assert [p.name for p in input_files(root)] == [
        "train-00000-of-00002.parquet",
        "train-00001-of-00002.parquet",
    ]
    reference = tmp_path / "train.jsonl"
    reference.write_text("".join(json.dumps(r) + "\n" for r in train))
    assert _contents(root) == _contents(reference)
    assert len(list(iter_rows(f"{root}:test"))) == 4
    with pytest.raises(Exception, match="no split 'validation'"):
        list(iter_rows(f"{root}:validation"))


def test_load_dataset_style_folder_of_jsonl_without_split_names_is_train(tmp_path):
    root = tmp_path / "local"
    root.mkdir()
    (root / "part-a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _table_rows(3, 0)))
    (root / "part-b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _table_rows(2, 1)))
    assert len(list(iter_pairs(root))) == 5


@pytest.mark.parametrize("kind", ["dataset", "dataset_dict"])
def test_save_to_disk_folders(tmp_path, kind):
    datasets = pytest.importorskip("datasets")
    train = _table_rows(7, 0)
    ds = datasets.Dataset.from_list(train)
    root = tmp_path / kind
    if kind == "dataset":
        ds.save_to_disk(str(root))
    else:
        datasets.DatasetDict(
            {"train": ds, "test": datasets.Dataset.from_list(_table_rows(3, 1))}
        ).save_to_disk(str(root))
        assert len(list(iter_rows(f"{root}:test"))) == 3
    reference = tmp_path / "train.jsonl"
    reference.write_text("".join(json.dumps(r) + "\n" for r in train))
    assert _contents(root) == _contents(reference)


def test_data_commands_and_training_read_a_hub_folder(tmp_path, capsys):
    from rewardplane.train.config import load_config
    from rewardplane.train.data import prepare_data

    root = tmp_path / "hub"
    (root / "data").mkdir(parents=True)
    rows = [r for r in generate_rows(60, seed=2) if isinstance(r.get("prompt"), str)]
    rows = [{"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]} for r in rows]
    pq.write_table(pa.Table.from_pylist(rows[:-8]), root / "data" / "train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(rows[-8:]), root / "data" / "test-00000-of-00001.parquet")
    assert main(["data", "validate", str(root), "--tokenizer", "builtin"]) == 0
    out = tmp_path / "prepared"
    argv = ["data", "prepare", str(root), "--out", str(out), "--eval-size", "2", "--seed-key", "k"]
    assert main(argv) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["input"]["name"] == "hub" and manifest["input"]["format"] == "hf_dir"
    assert manifest["counts"]["rows"] == len(rows) - 8
    probe = [
        "data",
        "freeze-probe",
        f"{root}:test",
        "--tokenizer",
        "builtin",
        "--out",
        str(tmp_path / "p.json"),
    ]
    assert main(probe) == 0
    cfg = load_config(
        None,
        ["model.tiny=tiny-llama", f"data.train={root}", f"data.eval={root}:test"],
    )
    prepared = prepare_data(cfg)
    assert len(prepared.train) == len(rows) - 8 and len(prepared.eval) == 8


def test_unterminated_array_validate_prints_the_checked_rows_then_exit_2(tmp_path, capsys):
    path = tmp_path / "cut.json"
    rows = [{"chosen": f"a{i}", "rejected": f"b{i}"} for i in range(5)]
    path.write_text(json.dumps(rows)[:-30])
    assert main(["data", "validate", str(path)]) == 2
    captured = capsys.readouterr()
    counts = {ln.split()[0]: int(ln.split()[1]) for ln in captured.out.splitlines() if len(ln.split()) == 2}
    assert counts["rows"] == counts["valid"] == 4
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "unterminated" in err
    out = tmp_path / "o"
    assert main(["data", "prepare", str(path), "--out", str(out), "--eval-size", "1", "--seed-key", "k"]) == 2
    assert "unterminated" in capsys.readouterr().err and not out.exists()
