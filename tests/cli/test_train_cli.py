import json

from rewardkit.cli import main


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
    assert "not a rewardkit checkpoint" in capsys.readouterr().err
