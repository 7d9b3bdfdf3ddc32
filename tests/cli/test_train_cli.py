import json

import pytest

from rewardplane.cli import main


def test_train_rm_cli_runs_resumes_and_exports(tmp_path, capsys):
    run = tmp_path / "run"

    def args(steps: int) -> list[str]:
        return [
            "train",
            "rm",
            "model.tiny=tiny-llama",
            "data.synth.train_rows=24",
            "data.synth.eval_rows=6",
            "data.max_length=96",
            f"run.run_dir={run}",
            f"run.max_steps={steps}",
            "run.global_batch_pairs=8",
            "run.progress=false",
        ]

    assert main(args(2)) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["step"] == 2 and report["checkpoint"].endswith("step-0000002")
    assert (run / "eval" / "step-0000002" / "summary.json").is_file()
    assert main([*args(3), "--resume", "auto"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["step"] == 3
    assert main(["export", "hf", report["checkpoint"], str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "config.json").is_file()


def test_train_rm_cli_usage_errors_exit_2(tmp_path, capsys):
    assert main(["train", "rm", "optim.nope=1"]) == 2
    assert "unknown config key" in capsys.readouterr().err
    assert main(["export", "hf", str(tmp_path), str(tmp_path / "x")]) == 2
    assert "not a rewardplane checkpoint" in capsys.readouterr().err


def test_corrupt_checkpoint_is_one_line_exit_2_in_eval_and_export(tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    base = ["model.tiny=tiny-llama", "data.synth.train_rows=16", "data.synth.eval_rows=4"]
    common = [*base, "data.max_length=96", f"run.run_dir={run}", "run.global_batch_pairs=8"]
    assert main(["train", "rm", *common, "run.max_steps=1", "run.progress=false"]) == 0
    checkpoint = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["checkpoint"]
    data = tmp_path / "eval.jsonl"
    assert main(["data", "synth", "--out", str(data), "--n", "6", "--seed", "3"]) == 0
    probe = tmp_path / "probe.json"
    freeze = ["data", "freeze-probe", str(data), "--tokenizer", "builtin", "--out", str(probe)]
    assert main([*freeze, "--max-length", "96"]) == 0
    capsys.readouterr()
    for how in ("flip", "truncate"):
        bad = tmp_path / f"bad-{how}"
        shutil.copytree(checkpoint, bad)
        weights = bad / "model.safetensors"
        data_bytes = bytearray(weights.read_bytes())
        if how == "flip":
            data_bytes[len(data_bytes) // 2] ^= 0xFF
        else:
            del data_bytes[len(data_bytes) // 2 :]
        weights.write_bytes(bytes(data_bytes))
        ev = ["eval", "--model", str(bad), "--probe", str(probe), "--data", str(data)]
        assert main([*ev, "--out", str(tmp_path / f"ev-{how}"), "--device", "cpu"]) == 2
        err = capsys.readouterr().err.strip()
        assert "sha256 mismatch" in err and str(weights) in err and len(err.splitlines()) == 1
        assert main(["export", "hf", str(bad), str(tmp_path / f"hf-{how}")]) == 2
        err = capsys.readouterr().err.strip()
        assert "sha256 mismatch" in err and str(weights) in err and len(err.splitlines()) == 1
        assert not (tmp_path / f"hf-{how}").exists()


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["model.tiny=null", "model.path=/nope"], "model.path=/nope: no such local directory"),
        (["model.tiny=null", "model.path=models/smol"], "model.path=models/smol: no such local directory"),
        (["model.tiny=tiny-lama"], "model.tiny must be one of"),
        (["model.tiny=null", "model.path={empty}"], "cannot load the model (ValueError"),
        (["data.tokenizer=no/such/tokenizer"], "data.tokenizer=no/such/tokenizer: no such local directory"),
    ],
)
def test_model_and_path_mistakes_are_one_line_exit_2(tmp_path, capsys, overrides, said):
    """Each once ended in a traceback: transformers took a missing path for a Hub repo id ("Repo
    id must use alphanumeric chars", "couldn't connect to huggingface.co"), a tiny-name typo was a
    KeyError. Never a hub message: nothing is downloaded."""
    (tmp_path / "empty").mkdir()
    argv = [
        "train",
        "rm",
        "data.synth.train_rows=16",
        "data.synth.eval_rows=4",
        f"run.run_dir={tmp_path / 'run'}",
    ]
    argv += [o.format(empty=tmp_path / "empty") for o in overrides]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0] and "Traceback" not in err[0]
    assert "huggingface" not in err[0].lower() and "repo id" not in err[0].lower()
    if "tiny-lama" in overrides[0]:
        assert "(did you mean tiny-llama?)" in err[0]


def test_debug_shows_the_traceback_behind_the_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("REWARDPLANE_DEBUG", "")  # restored (unset) after: --debug sets it for the process
    (tmp_path / "empty").mkdir()
    argv = [
        "train",
        "rm",
        "model.tiny=null",
        f"model.path={tmp_path / 'empty'}",
        f"run.run_dir={tmp_path / 'run'}",
    ]
    assert main([*argv, "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("rewardplane: error:")
