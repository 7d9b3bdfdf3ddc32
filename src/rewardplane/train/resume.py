"""Resuming a run strictly, and the run directory around it.

A resume continues one experiment, so the settings it runs with are the checkpoint's. Every
checkpoint records the resolved config it was trained with (`trainer_state.json`); on
`--resume`, a setting that differs from it is refused, in one line naming each key and both
values, unless it is on the allow-list below. Without this, `--resume auto optim.lr=5e-3`
kept the old learning rate (the optimizer state restores it) while `config.yaml` claimed the
new one.

May change on resume (`ALLOWED_ON_RESUME`): how long the run goes (`run.max_steps`, which also
stretches a cosine schedule from the resume on), how often it saves, keeps, evaluates and
reports progress, where it is tracked, and where it lives (`run.run_dir`). The data paths
(`data.prepared`, `data.train`, `data.eval`, `data.probe`, `data.synth`) may change too because their
*content* is checked instead: other training data is `data_mismatch` unless
`--allow-new-data`, another eval set is refused against step 0's probe. Each allowed change is
applied, logged and appended to `RUN/history.jsonl` as a resume event, and `config.yaml` is
rewritten with what runs now.

Also here: a fresh run into a used directory is refused; `--resume auto` with no checkpoint
says so and clears the stale `metrics.jsonl` of the aborted start; Ctrl-C reports the last
checkpoint, the steps since it and the command that resumes.
"""

from __future__ import annotations

import datetime
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import yaml

from rewardplane.core import legacy
from rewardplane.core.atomic import write_text
from rewardplane.core.errors import UsageError
from rewardplane.models.loading import CheckpointError
from rewardplane.train import checkpoint as ckpt

Trainer = Any
"""A `rewardplane.train.loop.Trainer` (not imported: the loop imports this module)."""

log = logging.getLogger("rewardplane.train")

HISTORY_FILE = "history.jsonl"
ALLOWED_ON_RESUME = (
    "run.max_steps",
    "run.run_dir",
    "run.save_every",
    "run.keep_last",
    "run.eval_every",
    "run.progress",
    "run.progress_every_s",
    "run.report_to",
    "run.tensorboard",
)
CONTENT_CHECKED = ("data.prepared", "data.train", "data.eval", "data.probe", "data.synth")
_UNSET = "<unset>"


def flatten(section: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys of a nested config dict (`{"run": {"max_steps": 4}}` -> `{"run.max_steps": 4}`)."""
    if not isinstance(section, dict) or (prefix and not section):
        return {prefix: section}
    flat: dict[str, Any] = {}
    for key, value in section.items():
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _allowed(key: str) -> bool:
    return key in ALLOWED_ON_RESUME or any(key == p or key.startswith(p + ".") for p in CONTENT_CHECKED)


def config_changes(recorded: dict[str, Any], current: dict[str, Any]) -> tuple[dict, dict]:
    """(allowed, refused) differences, each `{dotted key: (recorded, current)}`, in key order."""
    old, new = flatten(recorded), flatten(current)
    allowed, refused = {}, {}
    for key in sorted(old.keys() | new.keys()):
        was, now = old.get(key, _UNSET), new.get(key, _UNSET)
        if was != now:
            (allowed if _allowed(key) else refused)[key] = (was, now)
    return allowed, refused


def recorded_config(directory: Path, state: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The config the checkpoint was trained with, and where it was read from. Checkpoints written
    before they recorded it fall back to their run's config.yaml (what that run last started with)."""
    if isinstance(state.get("config"), dict):
        return state["config"], "the checkpoint"
    run_config = directory.parent.parent / "config.yaml"
    if run_config.is_file():
        return yaml.safe_load(run_config.read_text(encoding="utf-8")), str(run_config)
    return None, ""


def check_resume(trainer: Trainer, directory: Path, meta: dict[str, Any], state: dict[str, Any]) -> dict:
    """Refuse a resume that would not continue the same experiment; return the allowed changes."""
    cfg = trainer.cfg
    current = cfg.model_dump(mode="json")
    recorded, source = recorded_config(directory, state)
    allowed: dict[str, tuple[Any, Any]] = {}
    if recorded is None:
        log.warning("%s records no config: the settings of this resume are not compared with it", directory)
    else:
        allowed, refused = config_changes(recorded, current)
        if refused:
            raise CheckpointError(
                f"{directory}: cannot resume with other settings than {source} recorded: "
                + "; ".join(f"{key} was {was!r}, now {now!r}" for key, (was, now) in refused.items())
                + f" (only {', '.join(ALLOWED_ON_RESUME)} and the data paths may change on resume;"
                " start a new run to change the others)",
                code="resume_config_mismatch",
            )
    step = int(state["step"])
    if step > cfg.run.max_steps:
        raise CheckpointError(
            f"{directory} is at step {step}, past run.max_steps {cfg.run.max_steps}: pass"
            f" run.max_steps=N with N > {step} to train further",
            code="past_max_steps",
        )
    step0, eval_set = state.get("step0_eval"), trainer.eval_set
    if step0 and eval_set is not None and step0.get("probe_sha256") != eval_set.probe_sha256:
        raise CheckpointError(
            f"{directory}: the eval pairs differ from the ones this run evaluated at step 0 (probe"
            f" {str(step0.get('probe_sha256'))[:12]}, now {eval_set.probe_sha256[:12]}); a final number on"
            " other pairs is another experiment",
            code="eval_contract_mismatch",
        )
    return allowed


def restore(trainer: Trainer, directory: Path, *, allow_new_data: bool = False) -> None:
    """Restore model, optimizer, scheduler, sampler position and every rank's RNG from `directory`,
    after every refusal that applies: another objective or head, other data (unless
    `allow_new_data`), other settings than the allow-list's, a step past `run.max_steps`, other
    eval pairs than step 0's."""
    from rewardplane.data.overlap import read_training_content

    meta = ckpt.check_resumable(directory, world_size=trainer.info.world_size)
    trainer.objective.validate_resume(meta)
    trained_on = legacy.train_pairs_sha256(meta)  # checkpoints before issue 46: the old key
    new_data = trained_on != trainer.train_pairs_sha256
    if new_data and not allow_new_data:
        raise CheckpointError(
            f"{directory}: trained on data {str(trained_on)[:12]}, this run's data is"
            f" {trainer.train_pairs_sha256[:12]}; pass --allow-new-data to continue on different data",
            code="data_mismatch",
        )
    allowed = check_resume(
        trainer, directory, meta, json.loads((directory / "trainer_state.json").read_text())
    )
    trainer.objective.load_model_state(trainer.raw_model, directory)
    ckpt.load_optimizer_state(trainer.raw_model, trainer.optimizer, directory)
    state = ckpt.load_trainer_state(directory, trainer.info)
    trainer.scheduler.load_state_dict(state["scheduler"])
    if not new_data:  # on new data the position of the old data means nothing: start it afresh
        trainer.sampler.load_state_dict(state["sampler"])
    elif trainer.train_content is not None:  # the model has seen both: its record covers both
        earlier = read_training_content(directory, meta)
        trainer.train_content = None if isinstance(earlier, str) else earlier.union(trainer.train_content)
        if isinstance(earlier, str):
            log.warning("new data on resume: %s, so later checkpoints record none either", earlier)
    trainer.step = state["step"]
    trainer.pairs_consumed = state["pairs_consumed"]
    trainer.step0_eval = state.get("step0_eval")
    ckpt.set_rng_state(state["rng"])
    if trainer.info.is_main:
        dropped = truncate_metrics(trainer.run_dir / "metrics.jsonl", trainer.step)
        if dropped:
            log.info("metrics.jsonl: dropped %d rows after the restored step %d", dropped, trainer.step)
        record_resume(trainer.run_dir, directory, trainer.step, allowed)
    log.info("resumed from %s at step %d", directory, trainer.step)


def record_resume(run_dir: Path, directory: Path, step: int, allowed: dict[str, tuple[Any, Any]]) -> None:
    """Log each allowed change and append the resume event to RUN/history.jsonl."""
    for key, (was, now) in allowed.items():
        log.info("resume: %s %r -> %r", key, was, now)
    event = {
        "event": "resume",
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "checkpoint": str(directory),
        "step": step,
        "changed": {key: {"was": was, "now": now} for key, (was, now) in allowed.items()},
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / HISTORY_FILE, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(event, sort_keys=True) + "\n")


def resolve_resume(run_dir: Path, resume: str | None) -> str | None:
    """`--resume auto`: the run's latest checkpoint; with none, say so and clear the metrics of the
    aborted start (a fresh run writes metrics.jsonl from step 1; appending would mix two starts)."""
    if resume != "auto":
        return resume
    found = ckpt.latest_checkpoint(run_dir / "checkpoints")
    if found is not None:
        return str(found)
    from rewardplane.train.distributed import init_distributed

    if init_distributed().is_main:
        dropped = truncate_metrics(run_dir / "metrics.jsonl", 0)
        stale = f"; dropped the {dropped} metrics.jsonl rows of the start that saved none" if dropped else ""
        log.warning(
            "--resume auto: no checkpoint in %s, starting from step 0%s", run_dir / "checkpoints", stale
        )
    return None


def prepare_run_dir(run_dir: Path, *, resume: str | None, overwrite: bool) -> None:
    """Refuse a fresh run into a non-empty directory (exit 2, one line), or empty it for `overwrite`."""
    from rewardplane.train.distributed import barrier, init_distributed

    if resume and overwrite:
        raise UsageError("--resume and --overwrite exclude each other", code="usage")
    existing = sorted(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else []
    barrier()  # every rank has looked before rank 0 changes anything
    if not existing or resume:
        return
    if not overwrite:
        shown = ", ".join(existing[:4]) + (", ..." if len(existing) > 4 else "")
        raise UsageError(
            f"run directory {run_dir} is not empty ({shown}); pass --resume auto to continue that run"
            " or --overwrite to delete it and start again",
            code="run_dir_not_empty",
        )
    if init_distributed().is_main:
        for name in existing:
            target = run_dir / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink()
        log.info("--overwrite: emptied %s", run_dir)
    barrier()


def truncate_metrics(path: Path, step: int) -> int:
    """Keep the metrics rows up to `step` (a resume repeats the steps after it); return how many were dropped."""
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row_step = json.loads(line).get("step")
        except ValueError:
            dropped += 1  # a torn last line from a crash
            continue
        if isinstance(row_step, int) and row_step > step:
            dropped += 1
        else:
            kept.append(line)
    if dropped:
        write_text(path, "".join(line + "\n" for line in kept))
    return dropped


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during training, with where the run stood (the CLI reports it and how to resume)."""

    def __init__(self, run_dir: Path, step: int, max_steps: int) -> None:
        super().__init__(f"interrupted at step {step}")
        self.run_dir, self.step, self.max_steps = Path(run_dir), step, max_steps


def interrupt_report(exc: TrainingInterrupted, resume_command: str) -> str:
    """What Ctrl-C prints: the step reached, the checkpoint that survives, the steps lost, the command."""
    last = ckpt.latest_checkpoint(exc.run_dir / "checkpoints")
    lines = [f"rewardplane: training interrupted at step {exc.step} of {exc.max_steps}"]
    if last is None:
        lines.append(
            f"  no checkpoint saved yet (run.save_every saves every N steps; 0 saves only at the end):"
            f" the {exc.step} steps will be trained again"
        )
    else:
        saved = int(ckpt.STEP_RE.match(last.name).group(1))
        lost = max(0, exc.step - saved)
        again = (
            "nothing is lost"
            if lost == 0
            else f"the {lost} step{'s' if lost > 1 else ''} since it will be trained again"
        )
        lines.append(f"  last checkpoint: {last} (step {saved}); {again}")
    lines.append(f"  resume with: {resume_command}")
    return "\n".join(lines)
