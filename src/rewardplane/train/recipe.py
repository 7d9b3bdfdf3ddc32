"""The one recipe: an objective (from the objective registry), its data and the one loop.

`rewardplane train <command> --config cfg.yaml [key=value ...]` and `make demo` end up in `run`.
Which objective trains is the config's (`config_model(objective)` in `rewardplane.train.config`);
the objective is built from its typed sections (`build_objective`), the data prepared by
`rewardplane.train.data`, the loop is `rewardplane.train.loop`. Everything that is not
objective-specific (data preparation, sampling, accumulation, optimiser, checkpoints, resume,
evaluation artifacts) is shared, so a new objective needs no recipe of its own.
"""

from __future__ import annotations

from rewardplane.objectives import registry
from rewardplane.objectives.base import Objective, RunShape, Sections, TrainPairs
from rewardplane.train.config import BaseTrainConfig
from rewardplane.train.data import PreparedData, prepare_data
from rewardplane.train.loop import RunResult, train_objective


def build_objective(cfg: BaseTrainConfig, pairs: TrainPairs | PreparedData | None = None) -> Objective:
    """The config's objective, given the typed sections it reads and the pairs it trains on."""
    spec = registry.spec(cfg.objective)
    if isinstance(pairs, PreparedData):
        pairs = TrainPairs(pairs.train, pairs.train_pairs_sha256, pairs.eval, pairs.probe_sha256)
    run = cfg.run
    sections = Sections(
        model=cfg.model,
        data=cfg.data,
        run=RunShape(run.layout, run.run_dir, run.global_batch_pairs, run.grad_accum),
        settings=getattr(cfg, spec.section),
    )
    return spec.resolve("objective")(sections, pairs or TrainPairs())


def run(
    cfg: BaseTrainConfig, *, resume: str | None = None, allow_new_data: bool = False, overwrite: bool = False
) -> RunResult:
    """Prepare data, train, checkpoint and evaluate; `resume` is a checkpoint dir or "auto"."""
    data = prepare_data(cfg)
    objective = build_objective(cfg, data)
    return train_objective(
        cfg, objective, data, resume=resume, allow_new_data=allow_new_data, overwrite=overwrite
    )
