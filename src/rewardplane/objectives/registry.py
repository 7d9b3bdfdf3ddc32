"""The objectives: one table, from which everything that lists objectives is derived.

Each row holds what rewardplane needs of an objective, by reference (`module:attribute`,
imported on first use, so `rewardplane --help` does not import torch):

- `settings`: the pydantic model of its own config section (`section:`, e.g. `dpo:`);
  `rewardplane.train.config.config_model` adds it to the shared sections (model, data, optim, run).
  It lives in a torch-free module (`objectives/<name>_settings.py`), so the whole config is
  checked, an unknown key in this section included, before torch is imported;
- `objective`: the training component (`rewardplane.objectives.base.Objective`), built from
  typed sections (`Sections`) and the run's pairs (`TrainPairs`) by `rewardplane.train.recipe`;
- `load_scorer`: a saved checkpoint → `PairScorer` (`rewardplane eval`, `load_pair_scorer`);
- `exporter`: `rewardplane export hf` for its checkpoints (a function in `rewardplane.models`,
  below this layer, so the dispatch lives here, `export_hf`, and imports still run down);
- `command`, `summary`, `docs`: the `rewardplane train <command>` subcommand and its help;
- `check_written` (optional): a check on the config as written, before defaults fill it in.

So a new objective touches its modules (`objectives/<name>.py` and its torch-free
`objectives/<name>_settings.py`) and one row here
(`tests/objectives/test_registry.py` registers a toy one and trains, scores and exports it).
A checkpoint names its objective in `rewardplane.json`'s `objective`, the key of this table.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Ref = str | Callable[..., Any] | type
"""`"package.module:attribute"` (imported on first use) or the object itself."""


@dataclass(frozen=True)
class ObjectiveSpec:
    name: str  # `objective` in checkpoint metadata
    command: str  # `rewardplane train <command>`
    summary: str  # its help line
    docs: str  # the page that lists its config keys
    section: str  # its own config section
    settings: Ref  # that section's model (a `rewardplane.core.config.ConfigModel`)
    objective: Ref  # `Objective(sections, pairs)`
    load_scorer: Ref  # `load_scorer(path, *, device, reference_path, dtype, max_batch_tokens)`
    exporter: Ref  # `exporter(checkpoint, out) -> report`
    check_written: Ref | None = None  # `check_written(config_data)`, before defaults apply

    def resolve(self, field: str) -> Any:
        """The object a field names, imported on first use."""
        ref = getattr(self, field)
        if not isinstance(ref, str):
            return ref
        module, _, attribute = ref.partition(":")
        return getattr(importlib.import_module(module), attribute)


OBJECTIVES: dict[str, ObjectiveSpec] = {
    spec.name: spec
    for spec in (
        ObjectiveSpec(
            name="reward_model",
            command="rm",
            summary="train a Bradley–Terry reward model",
            docs="docs/training.md",
            section="loss",
            settings="rewardplane.objectives.reward_model_settings:RewardModelSettings",
            objective="rewardplane.objectives.reward_model:RewardModelObjective",
            load_scorer="rewardplane.objectives.reward_model:load_scorer",
            exporter="rewardplane.models.export:export_reward_model",
        ),
        ObjectiveSpec(
            name="dpo",
            command="dpo",
            summary="train a causal-LM policy with DPO against a frozen reference",
            docs="docs/dpo.md",
            section="dpo",
            settings="rewardplane.objectives.dpo_settings:DPOSettings",
            objective="rewardplane.objectives.dpo:DPOPolicyObjective",
            load_scorer="rewardplane.objectives.dpo:load_scorer",
            exporter="rewardplane.models.export:export_dpo_policy",
            check_written="rewardplane.objectives.dpo_settings:check_written",
        ),
    )
}


def spec(name: str) -> ObjectiveSpec:
    """The row of objective `name`; a `KeyError` names the known ones."""
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise KeyError(f"unknown objective {name!r}; known: {', '.join(sorted(OBJECTIVES))}") from None


def by_command(command: str) -> ObjectiveSpec:
    """The row whose `rewardplane train <command>` this is."""
    return next(s for s in OBJECTIVES.values() if s.command == command)


def checkpoint_objective(path: str | Path) -> str:
    """The `objective` a rewardplane checkpoint records; a directory without `rewardplane.json`
    (an HF `*ForSequenceClassification` model) is a reward model."""
    from rewardplane.models.loading import OBJECTIVE, is_checkpoint, read_metadata

    if not is_checkpoint(path):
        return OBJECTIVE
    # read_metadata: a corrupt rewardplane.json is a coded CheckpointError (one line), not a traceback
    return read_metadata(path).get("objective")


def load_pair_scorer(path: str | Path, **options: Any):
    """The scorer of whatever objective trained `path` (pairs → chosen, rejected, losses).
    `options` are the `load_scorer` keywords every objective takes: `device`, `reference_path`,
    `dtype`, `max_batch_tokens` (None or left out: the objective's own default)."""
    from rewardplane.models.loading import CheckpointError

    objective = checkpoint_objective(path)
    if objective not in OBJECTIVES:
        raise CheckpointError(
            f"{path}: objective {objective!r} has no scorer; known: {', '.join(sorted(OBJECTIVES))}",
            code="wrong_objective",
        )
    if options.get("max_batch_tokens", 0) is None:
        del options["max_batch_tokens"]
    return OBJECTIVES[objective].resolve("load_scorer")(path, **options)


def export_hf(checkpoint: str | Path, out: str | Path, *, overwrite: bool = False) -> dict[str, Any]:
    """`rewardplane export hf`: the checkpoint's objective's exporter, into a new directory (or,
    with `overwrite`, which the CLI asks the user for: core/outputs.py, replacing `out` whole)."""
    from rewardplane.core.errors import UsageError
    from rewardplane.models.export import ExportError
    from rewardplane.models.loading import read_metadata

    checkpoint, out = Path(checkpoint), Path(out)
    if out.exists() and not overwrite:
        raise UsageError(f"{out} already exists; choose a new output directory")
    objective = read_metadata(checkpoint).get("objective")
    if objective not in OBJECTIVES:
        raise ExportError(
            f"no HF exporter for objective {objective!r}; known: {', '.join(sorted(OBJECTIVES))}"
        )
    return OBJECTIVES[objective].resolve("exporter")(checkpoint, out)
