"""The objective registry is the one table: a new objective is its module plus one row.

The toy objective (`tests/support/toy_objective.py`: settings, objective, scorer loader,
exporter) is registered with one row and nothing else; the CLI subcommand, its config section,
training, `rewardplane eval`'s scorer and `rewardplane export hf` then all find it.
"""

from __future__ import annotations

import json

import pytest
import torch

from rewardplane.cli import build_parser, main
from rewardplane.core.errors import ConfigError
from rewardplane.models.loading import FORMAT_VERSION, CheckpointError
from rewardplane.objectives import registry
from rewardplane.objectives.registry import ObjectiveSpec
from rewardplane.train.config import config_model, load_objective_config
from support import toy_objective

torch.set_num_threads(1)

TOY = ObjectiveSpec(
    name="toy",
    command="toy",
    summary="train the toy bag-of-tokens scorer",
    docs="tests/support/toy_objective.py",
    section="toy",
    settings=toy_objective.ToySettings,
    objective=toy_objective.ToyObjective,
    load_scorer=toy_objective.load_scorer,
    exporter=toy_objective.export,
)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(registry.OBJECTIVES, "toy", TOY)
    return TOY


def test_every_row_resolves_and_names_a_unique_command():
    commands = [spec.command for spec in registry.OBJECTIVES.values()]
    assert len(set(commands)) == len(commands)
    for spec in registry.OBJECTIVES.values():
        for field in ("settings", "objective", "load_scorer", "exporter"):
            assert callable(spec.resolve(field)), (spec.name, field)
        assert spec.section in config_model(spec.name).model_fields


def test_a_registered_objective_has_a_command_and_a_config_section(toy):
    parser = build_parser()
    args = parser.parse_args(["train", "toy", "toy.margin=0.5"])
    assert args.objective_name == "toy"
    cfg = load_objective_config("toy", None, ["toy.margin=0.5"])
    assert cfg.toy.margin == 0.5 and cfg.objective == "toy"
    with pytest.raises(ConfigError, match="toy.margin"):
        load_objective_config("toy", None, ["toy.margin=0"])
    with pytest.raises(ConfigError, match="unknown config key toy.margn"):
        load_objective_config("toy", None, ["toy.margn=1"])


def test_the_toy_trains_scores_and_exports_through_the_cli(toy, tmp_path, capsys):
    run_dir = tmp_path / "run"
    overrides = [
        "data.synth={train_rows: 24, eval_rows: 8, seed: 0}",
        "data.max_length=96",
        "data.max_completion_length=48",
        f"run.run_dir={run_dir}",
        "run.max_steps=3",
        "run.global_batch_pairs=8",
        "run.progress=false",
        "optim.lr=0.5",
        "optim.schedule=constant",
        "toy.margin=0.25",
    ]
    assert main(["train", "toy", *overrides]) == 0
    checkpoint = run_dir / "checkpoints" / "step-0000003"
    meta = json.loads((checkpoint / "rewardplane.json").read_text())
    assert meta["objective"] == "toy" and meta["margin"] == 0.25
    assert (checkpoint / toy_objective.WEIGHTS).is_file()
    assert "margin: 0.25" in (run_dir / "config.yaml").read_text()

    scorer = registry.load_pair_scorer(checkpoint, device="cpu")
    assert scorer.objective == "toy" and scorer.scoring == {"path": "bag of tokens"}

    out = tmp_path / "export"
    assert main(["export", "hf", str(checkpoint), str(out)]) == 0
    weights = json.loads((out / "weights.json").read_text())
    assert len(weights) > 0 and any(w != 0 for w in weights)  # trained: the zeros moved


def test_an_unregistered_objective_is_refused_in_one_line(tmp_path):
    meta = {"objective": "toy", "role": "reward_model", "format_version": FORMAT_VERSION}
    (tmp_path / "rewardplane.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError) as err:
        registry.load_pair_scorer(tmp_path, device="cpu")
    assert err.value.code == "wrong_objective"
    assert "known: dpo, reward_model" in str(err.value)
