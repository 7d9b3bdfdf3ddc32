"""Experiment tracking: `run.report_to: [trackio | wandb | tensorboard | none]` (default none).

Every tracker receives what `metrics.jsonl` holds, per optimizer step, under TRL's names
(`loss`, `accuracy`, `margin`, `rewards/chosen`, `rewards/rejected`, `rewards/margins`,
`rewards/accuracies`, `learning_rate`, `grad_norm`, and for DPO `logps/chosen`, ...) with
TRL's `train/` prefix, and each evaluation's summary under `eval/`. Trackers are optional
packages; naming one that is not installed is a one-line usage error before training starts.
trackio (local-first: a SQLite database and dashboard on this machine) and TensorBoard write
locally; wandb follows its own `WANDB_MODE` (`offline` keeps it local).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rewardplane.core.errors import UsageError

REPORT_TO = ("trackio", "wandb", "tensorboard", "none")

TRL_ALIASES = (
    ("margin", "margin_mean"),
    ("rewards/chosen", "chosen_mean"),
    ("rewards/rejected", "rejected_mean"),
    ("rewards/margins", "margin_mean"),
    ("rewards/accuracies", "accuracy"),
    ("learning_rate", "lr"),
)
"""TRL's metric names, added beside rewardplane's own where an objective did not log them itself."""


def with_trl_names(metrics: dict[str, Any]) -> dict[str, Any]:
    for trl, ours in TRL_ALIASES:
        if trl not in metrics and ours in metrics:
            metrics[trl] = metrics[ours]
    return metrics


class Trackers:
    """The `report_to` backends of one run (rank 0 only)."""

    def __init__(self, report_to: list[str], *, run_dir: Path, config: dict[str, Any]) -> None:
        self.backends: list[tuple[str, Any]] = []
        names = [n for n in dict.fromkeys(report_to) if n != "none"]
        name = Path(run_dir).name
        for backend in names:
            if backend == "trackio":
                trackio = _need("trackio", "trackio")
                trackio.init(project="rewardplane", name=name, config=config)
                self.backends.append((backend, trackio))
            elif backend == "wandb":
                wandb = _need("wandb", "wandb")
                run = wandb.init(project="rewardplane", name=name, config=config, dir=str(run_dir))
                self.backends.append((backend, run if run is not None else wandb))
            elif backend == "tensorboard":
                try:
                    from torch.utils.tensorboard import SummaryWriter
                except ImportError:
                    raise UsageError(
                        "run.report_to=tensorboard needs the tensorboard package (pip install 'rewardplane[tensorboard]')"
                    ) from None
                self.backends.append((backend, SummaryWriter(str(Path(run_dir) / "tensorboard"))))

    def log(self, values: dict[str, float], step: int) -> None:
        for backend, handle in self.backends:
            if backend == "tensorboard":
                for key, value in values.items():
                    handle.add_scalar(key, value, step)
            else:
                handle.log(values, step=step)

    def close(self) -> None:
        for backend, handle in self.backends:
            if backend == "tensorboard":
                handle.close()
            else:
                handle.finish()
        self.backends = []


def check_report_to(report_to: list[str]) -> list[str]:
    unknown = [n for n in report_to if n not in REPORT_TO]
    if unknown:
        raise UsageError(
            f"run.report_to: unknown {unknown}; choose from {', '.join(REPORT_TO)}", code="config"
        )
    return report_to


def _need(module: str, package: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError(
            f"run.report_to={module} needs the {package} package (pip install {package})"
        ) from None
