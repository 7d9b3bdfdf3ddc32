"""DPO recipe: `run(config)` wires the DPO policy objective, the data and the loop.

`rewardplane train dpo --config cfg.yaml [key=value ...]` ends up in `run`. The objective is
`rewardplane.objectives.dpo`; everything that is not DPO-specific (data preparation, sampling,
accumulation, optimiser, checkpoints, resume, evaluation artifacts) is shared with reward models.
"""

from __future__ import annotations

from rewardplane.objectives.dpo import DPOPolicyObjective
from rewardplane.train.config import DPOTrainConfig
from rewardplane.train.data import prepare_data
from rewardplane.train.loop import RunResult, train_objective


def run(
    cfg: DPOTrainConfig, *, resume: str | None = None, allow_new_data: bool = False, overwrite: bool = False
) -> RunResult:
    """Prepare data, train the policy against its frozen reference, checkpoint, evaluate."""
    data = prepare_data(cfg)
    objective = DPOPolicyObjective(
        cfg,
        train_pairs=data.train,
        train_pairs_sha256=data.train_pairs_sha256,
        eval_pairs=data.eval,
        eval_sha256=data.probe_sha256,
    )
    return train_objective(
        cfg, objective, data, resume=resume, allow_new_data=allow_new_data, overwrite=overwrite
    )
