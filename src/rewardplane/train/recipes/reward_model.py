"""Reward-model recipe: `run(config)` wires the Bradley–Terry objective, the data and the loop.

`rewardplane train rm --config cfg.yaml [key=value ...]` and `make demo` both end up in `run`.
The objective is `rewardplane.objectives.reward_model`, the data `rewardplane.train.data`, the
loop `rewardplane.train.loop`.
"""

from __future__ import annotations

from rewardplane.objectives.reward_model import RewardModelObjective
from rewardplane.train.config import TrainConfig
from rewardplane.train.data import prepare_data
from rewardplane.train.loop import RunResult, train_objective


def run(
    cfg: TrainConfig, *, resume: str | None = None, allow_new_data: bool = False, overwrite: bool = False
) -> RunResult:
    """Prepare data, train, checkpoint and evaluate; `resume` is a checkpoint dir or "auto"."""
    data = prepare_data(cfg)
    objective = RewardModelObjective(cfg)
    return train_objective(
        cfg, objective, data, resume=resume, allow_new_data=allow_new_data, overwrite=overwrite
    )
