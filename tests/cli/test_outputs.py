"""No command deletes or overwrites a file it did not write in that run (issue 47): each command that
writes a folder refuses a non-empty one, and each that writes a file refuses an existing one, in one
line (exit 2) that lists what is there, leaving it untouched; `--overwrite` is the user's consent.
The refusal comes before any work, so these tests load no model."""

from __future__ import annotations

import json

import pytest
import yaml

from rewardplane.cli import main
from support.bench_qualify import plan_doc

MINE = "written by the user, not by this run\n"

# (argv with {out} where the command writes, whether {out} is a folder); the inputs exist but need
# not be valid: the output is checked before they are read
COMMANDS = {
    "data prepare": (["data", "prepare", "{synth}", "--out", "{out}", "--eval-size", "5", "--seed-key", "k"], True),
    "data freeze-probe": (["data", "freeze-probe", "{synth}", "--tokenizer", "builtin", "--out", "{out}"], False),
    "data synth": (["data", "synth", "--out", "{out}", "--n", "3"], False),
    "data validate --report": (["data", "validate", "{synth}", "--report", "{out}"], False),
    "export hf": (["export", "hf", "{tmp}", "{out}"], True),
    "eval --probe": (["eval", "--model", "{tmp}", "--probe", "{synth}", "--data", "{synth}", "--out", "{out}"], True),
    "eval --benchmark": (["eval", "--model", "{tmp}", "--benchmark", "rewardbench", "--data", "{synth}", "--out", "{out}"], True),
    "compare": (["compare", "{tmp}/a.jsonl", "{tmp}/b.jsonl", "--out", "{out}"], True),
    "report": (["report", "{tmp}", "--out", "{out}"], True),
    "score": (["score", "{synth}", "--url", "http://127.0.0.1:9", "--out", "{out}"], False),
    "bench": (["bench", "--url", "http://127.0.0.1:9", "--scorers", "a", "--out", "{out}"], False),
    "bench --csv": (["bench", "--url", "http://127.0.0.1:9", "--scorers", "a", "--out", "{tmp}/new.json", "--csv", "{out}"], False),
    "qualify": (["qualify", "--plan", "{tmp}/plan.yaml", "--out", "{out}"], True),
}  # fmt: skip


@pytest.fixture
def synth(tmp_path):
    path = tmp_path / "synth.jsonl"
    assert main(["data", "synth", "--out", str(path), "--n", "30"]) == 0
    return path


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_refuses_to_write_over_what_it_did_not_write(name, tmp_path, synth, capsys):
    argv, is_folder = COMMANDS[name]
    out = tmp_path / "taken"
    mine = out / "probe.json" if is_folder else out
    mine.parent.mkdir(exist_ok=True)
    mine.write_text(MINE)
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan_doc(modes=["dedicated"])))
    capsys.readouterr()
    assert main([a.format(synth=synth, out=out, tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--overwrite" in err, err
    assert ("is not empty (probe.json)" if is_folder else "already exists") in err
    assert mine.read_text() == MINE
    assert not is_folder or [p.name for p in out.iterdir()] == ["probe.json"]


def test_re_preparing_the_tours_folder_keeps_its_probe_unless_asked(tmp_path, synth, capsys):
    """The tour freezes its probe into data/; a second `data prepare --out data/` used to delete it."""
    data = tmp_path / "data"
    prepare = ["data", "prepare", str(synth), "--out", str(data), "--eval-size", "5", "--seed-key", "k"]
    prepare += ["--tokenizer", "builtin"]
    assert main(prepare) == 0
    assert main(["data", "freeze-probe", str(data), "--out", str(data / "probe.json")]) == 0
    before = {p.name: p.read_bytes() for p in data.iterdir()}
    capsys.readouterr()
    assert main(prepare) == 2
    err = capsys.readouterr().err
    assert "eval.jsonl, manifest.json, probe.json, rejects.jsonl, train.jsonl" in err
    assert {p.name: p.read_bytes() for p in data.iterdir()} == before
    assert main([*prepare, "--overwrite"]) == 0  # consent: the folder is replaced whole
    assert sorted(p.name for p in data.iterdir()) == [
        "eval.jsonl",
        "manifest.json",
        "rejects.jsonl",
        "train.jsonl",
    ]
    assert json.loads((data / "manifest.json").read_text())["counts"]["eval"] == 5


def test_an_empty_or_absent_folder_is_written_and_a_file_where_a_folder_goes_is_refused(
    tmp_path, synth, capsys
):
    for out in (tmp_path / "empty", tmp_path / "absent"):
        if out.name == "empty":
            out.mkdir()
        argv = ["data", "prepare", str(synth), "--out", str(out), "--eval-size", "5", "--seed-key", "k"]
        assert main(argv) == 0 and (out / "manifest.json").is_file()
    capsys.readouterr()
    argv = [
        "data",
        "prepare",
        str(synth),
        "--out",
        str(synth),
        "--eval-size",
        "5",
        "--seed-key",
        "k",
        "--overwrite",
    ]
    assert main(argv) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
