"""Run directories: no silent mixing of runs, resume truncates metrics, one length default, quiet progress."""

from __future__ import annotations

import io
import json

from rewardplane.cli import main
from rewardplane.core.progress import Progress
from rewardplane.data.tokenize import TokenizeSettings
from rewardplane.train.config import TrainConfig
from rewardplane.train.resume import truncate_metrics
from support.rm import tiny_rm_argv


def _argv(run, steps, *extra):
    return tiny_rm_argv(run, steps, "run.save_every=1", "run.keep_last=5", *extra)


def _steps(run):
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_fresh_run_into_a_used_dir_refuses_unless_resume_or_overwrite(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(_argv(run, 3)) == 0
    assert _steps(run) == [1, 2, 3]
    capsys.readouterr()
    assert main(_argv(run, 3)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not empty" in err and "--overwrite" in err and "--resume" in err
    assert _steps(run) == [1, 2, 3]  # untouched
    assert main([*_argv(run, 3), "--resume", "auto", "--overwrite"]) == 2
    capsys.readouterr()
    # resume from step 1: metrics.jsonl is cut back to step 1 before steps 2.. are trained again
    assert main([*_argv(run, 3), "--resume", str(run / "checkpoints" / "step-0000001")]) == 0
    assert _steps(run) == [1, 2, 3]
    assert main([*_argv(run, 2), "--overwrite"]) == 0
    assert _steps(run) == [1, 2]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-0000001", "step-0000002"]


def test_truncate_metrics_keeps_rows_up_to_the_step_and_drops_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3, 4)) + '{"step": 5, "lo')
    assert truncate_metrics(path, 2) == 3
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2]
    assert truncate_metrics(tmp_path / "none.jsonl", 2) == 0


def test_one_default_for_max_lengths():
    data, settings = TrainConfig().data, TokenizeSettings()
    assert (data.max_length, data.max_completion_length) == (
        settings.max_length,
        settings.max_completion_length,
    )
    assert (settings.max_length, settings.max_completion_length) == (1024, 512)


def test_progress_without_a_terminal_prints_one_line_per_interval():
    stream = io.StringIO()
    with Progress(500, "train", unit="step", every_s=3600, stream=stream) as bar:
        for _ in range(500):
            bar.update(1, loss="0.5")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train: 500/500 step (100%)") and "loss 0.5" in lines[0]
    stream = io.StringIO()
    with Progress(3, "eval", every_s=0, stream=stream) as bar:
        for _ in range(3):
            bar.update(1)
    assert len(stream.getvalue().splitlines()) == 4  # one per update at every_s=0, plus the final line


def test_training_progress_on_a_pipe_is_a_few_lines(tmp_path, capsys):
    run = tmp_path / "run"
    argv = [a for a in _argv(run, 4) if a != "run.progress=false"] + ["run.progress_every_s=3600"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert len([line for line in err.splitlines() if line.startswith("train:")]) == 1


def test_step0_eval_line_says_ties(tmp_path, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="rewardplane.train")
    assert main(_argv(tmp_path / "run", 1)) == 0
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("eval step 0")]
    assert lines and "tie-aware" in lines[0] and "ties" in lines[0]
