"""Strict resume: other settings are refused, the allow-list is applied and recorded, a stale start
is cleared, and Ctrl-C says what survives and how to continue (rewardplane.train.resume)."""

from __future__ import annotations

import json
import shlex

import numpy as np
import yaml

from rewardplane.cli import main
from rewardplane.data.overlap import FILE, TrainingContent
from support.rm import tiny_rm_argv


def _argv(run, steps, *extra):
    return tiny_rm_argv(run, steps, "run.save_every=1", *extra)


def _steps(run):
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _config(run):
    return yaml.safe_load((run / "config.yaml").read_text())


def test_a_changed_setting_is_refused_naming_each_key_and_both_values(tmp_path, capsys):
    """The bug: `--resume auto optim.lr=5e-3` kept the old rate (restored with the optimizer) and
    wrote the new one into config.yaml. Now: one line, exit 2, config.yaml untouched."""
    run = tmp_path / "run"
    assert main(_argv(run, 2, "optim.lr=1e-3")) == 0
    before = (run / "config.yaml").read_text()
    capsys.readouterr()
    argv = _argv(run, 2, "optim.lr=5e-3", "loss.use_margin=false", "--resume", "auto")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "[resume_config_mismatch]" in err
    assert "optim.lr was 0.001, now 0.005" in err and "loss.use_margin was True, now False" in err
    assert "run.max_steps" in err  # the allow-list is named
    assert (run / "config.yaml").read_text() == before
    assert not (run / "history.jsonl").exists()


def test_allowed_changes_are_applied_and_recorded_as_a_resume_event(tmp_path):
    run = tmp_path / "run"
    assert main(_argv(run, 2)) == 0
    argv = _argv(run, 4, "run.eval_every=1", "run.keep_last=1", "--resume", "auto")
    assert main(argv) == 0
    assert _steps(run) == [1, 2, 3, 4]
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-0000004"]  # keep_last applied
    assert (run / "eval" / "step-0000003" / "summary.json").is_file()  # eval_every applied
    config = _config(run)
    assert (config["run"]["max_steps"], config["run"]["eval_every"]) == (4, 1)  # what ran
    events = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    assert len(events) == 1 and events[0]["event"] == "resume" and events[0]["step"] == 2
    assert events[0]["changed"]["run.max_steps"] == {"was": 2, "now": 4}
    assert set(events[0]["changed"]) == {"run.max_steps", "run.eval_every", "run.keep_last"}
    state = json.loads((run / "checkpoints" / "step-0000004" / "trainer_state.json").read_text())
    assert state["config"]["run"]["max_steps"] == 4  # the checkpoint records what it ran with


def test_resuming_past_max_steps_is_an_error(tmp_path, capsys):
    """The bug: forgetting run.max_steps on resume printed `1800/400 step (450%)` and exited 0."""
    run = tmp_path / "run"
    assert main(_argv(run, 3)) == 0
    capsys.readouterr()
    assert main(_argv(run, 2, "--resume", "auto")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "past run.max_steps 2" in err and "run.max_steps=N" in err
    assert _steps(run) == [1, 2, 3]


def test_resume_auto_without_a_checkpoint_says_so_and_clears_the_aborted_start(tmp_path, caplog):
    """The bug: --resume auto after a Ctrl-C before the first checkpoint started afresh silently and
    appended to the old metrics.jsonl (480 rows for a 400-step run)."""
    import logging

    run = tmp_path / "run"
    assert main(_argv(run, 3)) == 0
    for checkpoint in (run / "checkpoints").iterdir():
        for f in checkpoint.iterdir():
            f.unlink()
        checkpoint.rmdir()  # as if interrupted before the first save
    caplog.set_level(logging.INFO, logger="rewardplane.train")
    assert main(_argv(run, 2, "--resume", "auto")) == 0
    assert _steps(run) == [1, 2]
    said = [r.getMessage() for r in caplog.records if "--resume auto" in r.getMessage()]
    assert len(said) == 1 and "no checkpoint in" in said[0] and "dropped the 3 metrics.jsonl rows" in said[0]


def test_ctrl_c_reports_the_checkpoint_the_steps_since_and_the_command(tmp_path, capsys, monkeypatch):
    from rewardplane.train.loop import Trainer

    run = tmp_path / "run"
    real_step = Trainer.train_step

    def interrupted_at_4(self):
        if self.step == 3:
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(Trainer, "train_step", interrupted_at_4)
    argv = _argv(run, 6, "run.save_every=2")
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "training interrupted at step 3 of 6" in err
    assert f"last checkpoint: {run / 'checkpoints' / 'step-0000002'} (step 2)" in err
    assert "the 1 step since it will be trained again" in err
    command = err.split("resume with: ", 1)[1].strip()
    words = shlex.split(command)
    assert words[:3] == ["rewardplane", "train", "rm"] and words[-2:] == ["--resume", "auto"]
    monkeypatch.setattr(Trainer, "train_step", real_step)
    assert main(words[1:]) == 0  # the printed command continues the run
    assert _steps(run) == [1, 2, 3, 4, 5, 6]


def test_ctrl_c_before_any_checkpoint_says_so(tmp_path, capsys, monkeypatch):
    from rewardplane.train.loop import Trainer

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "train_step", interrupted)
    assert main(_argv(tmp_path / "run", 4, "run.save_every=0")) == 130
    err = capsys.readouterr().err
    assert "no checkpoint saved yet" in err and "--resume auto" in err


def test_new_data_on_resume_is_added_to_the_training_record(tmp_path, capsys):
    """A model resumed onto new data has seen both: its later checkpoints record both."""
    files = {}
    for name, n, seed in (("a", 16, 0), ("b", 16, 7), ("eval", 4, 3)):
        files[name] = tmp_path / f"{name}.jsonl"
        assert main(["data", "synth", "--out", str(files[name]), "--n", str(n), "--seed", str(seed)]) == 0
    run = tmp_path / "run"

    def argv(train, steps, *extra):
        data = ["data.synth=null", f"data.train={files[train]}", f"data.eval={files['eval']}"]
        return [a for a in _argv(run, steps, *data, *extra) if not a.startswith("data.synth={")]

    assert main(argv("a", 1)) == 0
    before = TrainingContent.from_bytes((run / "checkpoints" / "step-0000001" / FILE).read_bytes())
    capsys.readouterr()
    assert main(argv("b", 2, "--resume", "auto")) == 2  # other data needs --allow-new-data
    assert "data_mismatch" in capsys.readouterr().err
    assert main(argv("b", 2, "--resume", "auto", "--allow-new-data")) == 0
    after = TrainingContent.from_bytes((run / "checkpoints" / "step-0000002" / FILE).read_bytes())
    assert np.isin(before.pairs, after.pairs).all() and after.pairs.size == 2 * before.pairs.size == 32
    events = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    assert events[-1]["changed"]["data.train"] == {"was": str(files["a"]), "now": str(files["b"])}
