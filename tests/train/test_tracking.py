"""run.report_to: trackers get TRL-named metrics; a missing package is one line; the summary line."""

from __future__ import annotations

import json
import logging
import sys
import types

import pytest

from rewardplane.cli import main
from support.rm import tiny_rm_argv


def _argv(run, *extra):
    return tiny_rm_argv(run, 2, *extra)


class FakeTracker(types.ModuleType):
    def __init__(self, name):
        import importlib.machinery

        super().__init__(name)
        self.__spec__ = importlib.machinery.ModuleSpec(name, None)
        self.calls = []

    def init(self, **kwargs):
        self.calls.append(("init", kwargs))

    def log(self, values, step=None):
        self.calls.append(("log", dict(values), step))

    def finish(self):
        self.calls.append(("finish",))


@pytest.mark.parametrize("backend", ["trackio", "wandb"])
def test_report_to_logs_trl_metric_names(tmp_path, monkeypatch, backend):
    fake = FakeTracker(backend)
    monkeypatch.setitem(sys.modules, backend, fake)
    assert main(_argv(tmp_path / "run", f"run.report_to=[{backend}]")) == 0
    kinds = [c[0] for c in fake.calls]
    assert kinds[0] == "init" and kinds[-1] == "finish"
    assert fake.calls[0][1]["config"]["run"]["max_steps"] == 2
    train = [c for c in fake.calls if c[0] == "log" and any(k.startswith("train/") for k in c[1])]
    assert [c[2] for c in train] == [1, 2]
    for key in ("loss", "accuracy", "margin", "rewards/chosen", "rewards/rejected", "rewards/margins"):
        assert f"train/{key}" in train[0][1]
    assert train[0][1]["train/rewards/accuracies"] == train[0][1]["train/accuracy"]
    evals = [c for c in fake.calls if c[0] == "log" and "eval/accuracy" in c[1]]
    assert [c[2] for c in evals] == [0, 2]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["margin"] == rows[0]["margin_mean"] and rows[0]["learning_rate"] == rows[0]["lr"]


def test_missing_tracker_package_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import fails
    assert main(_argv(tmp_path / "run", "run.report_to=wandb")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "wandb" in err
    assert main(_argv(tmp_path / "run2", "run.report_to=[mlflow]")) == 2
    assert "report_to" in capsys.readouterr().err


def test_default_is_none_and_the_summary_line_is_trainer_comparable(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="rewardplane.train")
    assert main(_argv(tmp_path / "run")) == 0
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("train summary: ")]
    assert len(lines) == 1
    summary = json.loads(lines[0].removeprefix("train summary: "))
    for key in ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "epoch"):
        assert summary[key] is not None
    assert summary["global_step"] == 2 and 0.0 <= summary["eval_accuracy"] <= 1.0
    assert summary["epoch"] == pytest.approx(2 * 8 / 16)
