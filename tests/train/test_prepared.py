"""Prepared data flows forward: `data.prepared: DIR` trains on what `rewardplane data prepare`
wrote, refuses (one line, exit 2) a tokenizer or length setting other than the folder's, and the
checkpoint records the manifest's hash."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from rewardplane.cli import main
from rewardplane.core.hashing import sha256_file
from rewardplane.data.synth import builtin_tokenizer

torch.set_num_threads(1)

SETTINGS = ["data.max_length=96", "data.max_completion_length=48"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("prepared")
    rows = root / "rows.jsonl"
    assert main(["data", "synth", "--out", str(rows), "--n", "40"]) == 0
    folder = root / "data"
    options = ["--tokenizer", "builtin", "--max-length", "96", "--max-completion-length", "48"]
    args = ["data", "prepare", str(rows), "--out", str(folder), "--eval-size", "8", "--seed-key", "k"]
    assert main([*args, *options]) == 0
    return folder


def _train(run_dir, *overrides: str) -> int:
    run = [f"run.run_dir={run_dir}", "run.max_steps=1", "run.global_batch_pairs=8", "run.progress=false"]
    return main(["train", "rm", "model.tiny=tiny-llama", *run, *overrides])


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("rewardplane: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_training_from_a_prepared_folder_records_its_manifest(prepared, tmp_path, capsys):
    assert _train(tmp_path / "run", f"data.prepared={prepared}", *SETTINGS) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    meta = json.loads((tmp_path / "run" / "checkpoints" / "step-0000001" / "rewardplane.json").read_text())
    assert meta["prepared_manifest_sha256"] == sha256_file(prepared / "manifest.json")
    assert len(meta["train_pairs_sha256"]) == 64
    # the run's eval set is the folder's eval split: 8 pairs
    summary = json.loads((tmp_path / "run" / "eval" / "step-0000001" / "summary.json").read_text())
    assert summary["n_pairs"] == 8 and report["checkpoint"]


def test_a_mismatched_tokenizer_is_refused_in_one_line(prepared, tmp_path, capsys):
    other = copy.deepcopy(builtin_tokenizer())
    other.add_tokens(["<an-extra-token>"])
    other.save_pretrained(tmp_path / "tok")
    code = _train(
        tmp_path / "run", f"data.prepared={prepared}", f"data.tokenizer={tmp_path / 'tok'}", *SETTINGS
    )
    assert code == 2
    line = _one_line_error(capsys)
    assert f"data.prepared={prepared} (prepared with tokenizer 'builtin')" in line
    assert "tokenizer_sha256 differs: prepared" in line
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_other_length_settings_are_refused_with_the_folders_values(prepared, tmp_path, capsys):
    assert _train(tmp_path / "run", f"data.prepared={prepared}", "data.max_completion_length=48") == 2
    line = _one_line_error(capsys)
    assert "max_length prepared 96, this run 1024" in line
    assert "train with the folder's settings (data.max_length=96)" in line


def test_a_prepared_file_edited_since_is_refused(prepared, tmp_path, capsys):
    import shutil

    folder = tmp_path / "data"
    shutil.copytree(prepared, folder)
    lines = (folder / "train.jsonl").read_text().splitlines()
    (folder / "train.jsonl").write_text("\n".join(lines[1:]) + "\n")  # one pair fewer
    assert _train(tmp_path / "run", f"data.prepared={folder}", *SETTINGS) == 2
    assert "train.jsonl is not the file `rewardplane data prepare` wrote" in _one_line_error(capsys)


def test_prepared_and_files_together_are_refused(prepared, tmp_path, capsys):
    assert (
        _train(tmp_path / "run", f"data.prepared={prepared}", f"data.train={prepared / 'train.jsonl'}") == 2
    )
    assert "give either prepared or train/eval files or synth" in _one_line_error(capsys)
