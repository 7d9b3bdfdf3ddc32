"""`rewardplane eval` and `compare` count the evaluated pairs a model was trained on.

The tour once evaluated on its own training rows: 0.895 instead of the honest 0.832, and
`compare` called that model significantly better than a properly trained one, without a word.
"""

from __future__ import annotations

import json

import pytest

from rewardplane.cli import main
from rewardplane.data.overlap import FILE


def _synth(path, n, seed):
    assert main(["data", "synth", "--out", str(path), "--n", str(n), "--seed", str(seed)]) == 0
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny RM trained one step on 24 rows; a leaky eval set (6 training rows under new ids, one
    with its label flipped, and 6 fresh rows) and a clean one, each with its probe."""
    root = tmp_path_factory.mktemp("overlap")
    train = _synth(root / "train.jsonl", 24, 0)
    fresh = _synth(root / "fresh.jsonl", 12, 5)
    leaky = [{**row, "id": f"copy-{i}"} for i, row in enumerate(train[:6])]
    leaky[0] = {**leaky[0], "chosen": leaky[0]["rejected"], "rejected": leaky[0]["chosen"]}
    (root / "leaky.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*leaky, *fresh[:6]]))
    run = root / "run"
    argv = ["train", "rm", "model.tiny=tiny-llama", "data.synth=null", f"data.train={root / 'train.jsonl'}"]
    argv += ["data.max_length=96", f"run.run_dir={run}", "run.max_steps=1", "run.global_batch_pairs=8"]
    assert main([*argv, "run.progress=false"]) == 0
    for name in ("leaky", "fresh"):
        freeze = ["data", "freeze-probe", str(root / f"{name}.jsonl"), "--tokenizer", "builtin"]
        assert main([*freeze, "--max-length", "96", "--out", str(root / f"{name}.probe.json")]) == 0
    return root, run / "checkpoints" / "step-0000001"


def _eval(root, model, name, out, *extra):
    argv = ["eval", "--model", str(model), "--probe", str(root / f"{name}.probe.json")]
    return main(
        [*argv, "--data", str(root / f"{name}.jsonl"), "--out", str(out), "--replicates", "100", *extra]
    )


def test_eval_counts_training_pairs_by_content_and_warns(trained, tmp_path, capsys):
    root, model = trained
    capsys.readouterr()
    assert _eval(root, model, "leaky", tmp_path / "A") == 0
    captured = capsys.readouterr()
    assert "warning: 6 of 12 evaluated pairs are in the model's training data" in captured.err
    summary = json.loads((tmp_path / "A" / "summary.json").read_text())
    assert summary["train_overlap"]["checked"] and summary["train_overlap"]["pairs"] == 6
    assert summary["train_overlap"]["training_pairs"] == 24
    rows = [json.loads(line) for line in (tmp_path / "A" / "pairs.jsonl").read_text().splitlines()]
    assert [r["pair_id"] for r in rows if r["in_training"]] == [f"copy-{i}" for i in range(6)]
    assert _eval(root, model, "fresh", tmp_path / "B") == 0
    assert "none of the 12 evaluated pairs is in the model's training data" in capsys.readouterr().out
    assert json.loads((tmp_path / "B" / "summary.json").read_text())["train_overlap"]["pairs"] == 0


def test_strict_overlap_refuses_in_one_line_and_writes_nothing(trained, tmp_path, capsys):
    root, model = trained
    capsys.readouterr()
    assert _eval(root, model, "leaky", tmp_path / "A", "--strict-overlap") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--strict-overlap: 6 of 12 evaluated pairs" in err
    assert not (tmp_path / "A").exists()
    assert _eval(root, model, "fresh", tmp_path / "B", "--strict-overlap") == 0


def test_a_model_without_a_record_is_never_claimed_clean(trained, tmp_path, capsys):
    import shutil

    root, model = trained
    old = tmp_path / "old"
    shutil.copytree(model, old)
    (old / FILE).unlink()
    meta = json.loads((old / "rewardplane.json").read_text())
    del meta["training_data"]  # as written before the record existed
    (old / "rewardplane.json").write_text(json.dumps(meta))
    capsys.readouterr()
    assert _eval(root, old, "fresh", tmp_path / "A") == 0
    assert "could not be checked" in capsys.readouterr().err
    summary = json.loads((tmp_path / "A" / "summary.json").read_text())
    assert summary["train_overlap"]["checked"] is False and "pairs" not in summary["train_overlap"]
    assert "in_training" not in (tmp_path / "A" / "pairs.jsonl").read_text()
    assert _eval(root, old, "fresh", tmp_path / "B", "--strict-overlap") == 2
    assert "could not be checked" in capsys.readouterr().err


def test_a_corrupt_record_is_one_line(trained, tmp_path, capsys):
    import shutil

    root, model = trained
    bad = tmp_path / "bad"
    shutil.copytree(model, bad)
    (bad / FILE).write_bytes((bad / FILE).read_bytes()[:-3] + b"xyz")
    capsys.readouterr()
    assert _eval(root, bad, "fresh", tmp_path / "A") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and FILE in err and "corrupt" in err


def test_compare_warns_about_either_side_and_strict_refuses(trained, tmp_path, capsys):
    """Two evaluations of one probe: A overlaps its model's training data; `compare` says so for
    A, records both sides in comparison.json, and refuses with --strict-overlap."""
    root, model = trained
    assert _eval(root, model, "leaky", tmp_path / "A") == 0
    assert _eval(root, model, "leaky", tmp_path / "B") == 0
    rows = (tmp_path / "B" / "pairs.jsonl").read_text().splitlines()
    clean = [json.dumps({**json.loads(line), "in_training": False}) for line in rows]
    (tmp_path / "B" / "pairs.jsonl").write_text("\n".join(clean) + "\n")  # as if B's model had not seen them
    capsys.readouterr()
    argv = ["compare", str(tmp_path / "A" / "pairs.jsonl"), str(tmp_path / "B" / "pairs.jsonl")]
    assert main([*argv, "--out", str(tmp_path / "AB"), "--replicates", "100"]) == 0
    captured = capsys.readouterr()
    assert "6 of 12 evaluated pairs are in model A's training data" in captured.err
    assert "none of the 12 evaluated pairs is in model B's training data" in captured.out
    comparison = json.loads((tmp_path / "AB" / "comparison.json").read_text())
    assert comparison["train_overlap"]["a"]["pairs"] == 6 and comparison["train_overlap"]["b"]["pairs"] == 0
    assert main([*argv, "--out", str(tmp_path / "AB2"), "--strict-overlap"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--strict-overlap: A:" in err
    assert not (tmp_path / "AB2").exists()


def test_an_export_carries_its_checkpoint_record(trained, tmp_path, capsys):
    root, model = trained
    assert main(["export", "hf", str(model), str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / FILE).is_file()
    capsys.readouterr()
    assert _eval(root, tmp_path / "hf", "leaky", tmp_path / "A") == 0
    assert "6 of 12 evaluated pairs are in the model's training data" in capsys.readouterr().err
