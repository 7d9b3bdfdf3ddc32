"""`rewardplane data ...` as scripts use it: outputs, exit codes 0/1/2, one-line errors."""

from __future__ import annotations

import json

import pytest

from rewardplane.cli import main
from rewardplane.data import reasons as R


@pytest.fixture()
def synth(tmp_path):
    path = tmp_path / "synth.jsonl"
    assert main(["data", "synth", "--out", str(path), "--n", "60", "--seed", "1", "--corrupt", "1"]) == 0
    return path


def table(out: str) -> dict[str, int]:
    return {line.split()[0]: int(line.split()[1]) for line in out.splitlines() if len(line.split()) == 2}


def test_validate_clean_file_exits_0(tmp_path, capsys):
    path = tmp_path / "clean.json"
    assert main(["data", "synth", "--out", str(path), "--n", "30"]) == 0
    capsys.readouterr()
    assert main(["data", "validate", str(path), "--tokenizer", "builtin"]) == 0
    counts = table(capsys.readouterr().out)
    assert counts["rows"] == counts["valid"] == 30 and counts["rejected"] == 0


def test_validate_reports_every_reason_and_exits_1(tmp_path, synth, capsys):
    report = tmp_path / "rejects.jsonl"
    argv = ["data", "validate", str(synth), "--report", str(report), "--tokenizer", "builtin"]
    argv += ["--truncation", "truncate", "--max-length", "96", "--max-completion-length", "96"]
    capsys.readouterr()
    assert main(argv) == 1
    counts = table(capsys.readouterr().out)
    assert counts["rows"] == 60 + 12 and counts["valid"] == 61 and counts["rejected"] == 11
    assert all(counts[reason] == 1 for reason in R.REASONS)
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    assert [line["reason"] for line in lines] == list(R.REASONS)
    assert all(line["source_index"] >= 60 for line in lines)


def test_validate_without_tokenizer_skips_length_checks(synth, capsys):
    capsys.readouterr()
    assert main(["data", "validate", str(synth)]) == 1
    counts = table(capsys.readouterr().out)
    assert counts["oversize"] == counts["post_truncation"] == 0 and counts["rejected"] == 9


@pytest.mark.parametrize(
    "argv",
    [
        ["data", "validate", "missing.jsonl"],
        ["data", "validate", "{synth}", "--max-length", "10"],
        ["data", "validate", "{synth}", "--tokenizer", "no/such/dir"],
        ["data", "prepare", "{synth}", "--out", "{tmp}/o", "--eval-size", "9999", "--seed-key", "k"],
        ["data", "freeze-probe", "{synth}", "--tokenizer", "builtin", "--out", "{tmp}/p.json"],
        ["data", "synth", "--out", "{tmp}/x.csv", "--n", "3"],
    ],
)
def test_usage_and_io_errors_exit_2_with_one_line(argv, synth, tmp_path, capsys):
    argv = [a.format(synth=synth, tmp=tmp_path) for a in argv]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rewardplane: error:") and "\n" not in err and "Traceback" not in err


def test_prepare_then_freeze_probe(tmp_path, synth, capsys):
    out = tmp_path / "prep"
    argv = ["data", "prepare", str(synth), "--out", str(out), "--eval-size", "10", "--seed-key", "demo"]
    assert main([*argv, "--tokenizer", "builtin"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"] == {"rows": 72, "valid": 61, "rejected": 11, "train": 51, "eval": 10}
    probe_path = tmp_path / "probe.json"
    argv = [
        "data",
        "freeze-probe",
        str(out / "eval.jsonl"),
        "--tokenizer",
        "builtin",
        "--out",
        str(probe_path),
    ]
    assert main(argv) == 0
    probe = json.loads(probe_path.read_text())
    eval_ids = [json.loads(line)["pair_id"] for line in (out / "eval.jsonl").read_text().splitlines()]
    assert probe["pair_ids"] == eval_ids and probe["count"] == 10
    assert main(argv) == 2  # the probe is there: replaced only when asked
    assert main([*argv, "--overwrite"]) == 0 and json.loads(probe_path.read_text()) == probe


def test_synth_is_deterministic(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for path in (a, b):
        assert main(["data", "synth", "--out", str(path), "--n", "20", "--seed", "3", "--corrupt", "2"]) == 0
    assert a.read_bytes() == b.read_bytes()


def test_data_without_subcommand_prints_help(capsys):
    assert main(["data"]) == 2
    assert "validate" in capsys.readouterr().out


def test_freeze_probe_of_a_prepared_folder_takes_its_tokenizer_and_settings(tmp_path, synth, capsys):
    """A probe frozen from `prepare`'s output has the settings the data was prepared with (a probe at
    the default 1024 tokens would refuse a run that trains at 128); an option given still wins, and an
    eval.jsonl edited since the manifest was written no longer borrows its settings."""
    out = tmp_path / "prep"
    argv = ["data", "prepare", str(synth), "--out", str(out), "--eval-size", "10", "--seed-key", "demo"]
    assert (
        main([*argv, "--tokenizer", "builtin", "--max-length", "128", "--max-completion-length", "64"]) == 0
    )
    capsys.readouterr()
    for source in (out, out / "eval.jsonl"):
        probe_path = tmp_path / "probe.json"
        assert main(["data", "freeze-probe", str(source), "--out", str(probe_path), "--overwrite"]) == 0
        assert f"max_completion_length 64 from {out / 'manifest.json'})" in capsys.readouterr().out
        probe = json.loads(probe_path.read_text())
        assert (probe["settings"]["max_length"], probe["settings"]["max_completion_length"]) == (128, 64)
    assert (
        main(
            ["data", "freeze-probe", str(out), "--max-length", "96", "--out", str(probe_path), "--overwrite"]
        )
        == 0
    )
    assert json.loads(probe_path.read_text())["settings"]["max_length"] == 96
    edited = out / "eval.jsonl"
    edited.write_text(edited.read_text().replace("\n", "\n\n", 1))
    capsys.readouterr()
    assert main(["data", "freeze-probe", str(edited), "--out", str(probe_path), "--overwrite"]) == 2
    assert "--tokenizer is required" in capsys.readouterr().err
    assert (
        main(
            [
                "data",
                "freeze-probe",
                str(edited),
                "--tokenizer",
                "builtin",
                "--out",
                str(probe_path),
                "--overwrite",
            ]
        )
        == 0
    )
    assert json.loads(probe_path.read_text())["settings"]["max_length"] == 1024


def test_help_names_the_commands_as_they_are_spelled(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "freeze-probe" in out and "probe-freeze" not in out
