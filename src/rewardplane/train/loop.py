"""The one training loop: any `Objective`, single process, DDP or FSDP2.

Loss scaling (why gradients do not depend on how a step is split): every optimizer step
consumes exactly `global_batch_pairs` pairs. Each micro-batch contributes
`Σ per-pair loss × world_size / global_batch_pairs`; accumulation sums micro-batches and
DDP/FSDP2 average over ranks, which cancels the `world_size` factor, so the gradient is
`(1/N) Σ_all pairs ∇loss` whatever the world size or accumulation count.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rewardplane.core.atomic import write_text
from rewardplane.core.errors import UsageError
from rewardplane.core.progress import Progress
from rewardplane.data.overlap import FILE as TRAINING_DATA_FILE
from rewardplane.data.overlap import Overlap, TrainingContent
from rewardplane.data.records import TokenizedPair
from rewardplane.eval.metrics import TIE_TOLERANCE
from rewardplane.objectives.base import Objective
from rewardplane.train import checkpoint as ckpt
from rewardplane.train.config import BaseTrainConfig, dump_yaml
from rewardplane.train.distributed import (
    DistInfo,
    all_gather_objects,
    all_reduce_sum,
    grad_sync,
    init_distributed,
    transformer_blocks,
    wrap_model,
)
from rewardplane.train.resume import TrainingInterrupted, prepare_run_dir, resolve_resume, restore
from rewardplane.train.sampler import PairSampler
from rewardplane.train.tracking import Trackers, check_report_to, with_trl_names

if TYPE_CHECKING:
    from rewardplane.train.data import PreparedData

log = logging.getLogger("rewardplane.train")

# Order of the per-step sums that are all-reduced across ranks.
_SUMS = ("loss", "pairs", "correct", "ties", "c", "c2", "r", "r2", "m", "m2", "tokens", "slots")


@dataclass
class EvalSet:
    """The frozen evaluation pairs, the hash that identifies them in every artifact, and which of
    them are training pairs too (`data.overlap`; None: not checked)."""

    pairs: list[TokenizedPair]
    probe_sha256: str
    overlap: Overlap | None = None


@dataclass
class RunResult:
    run_dir: Path
    step: int
    checkpoint: Path | None
    last_metrics: dict[str, Any]
    eval_summaries: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def final_accuracy(self) -> float | None:
        if not self.eval_summaries:
            return None
        return self.eval_summaries[max(self.eval_summaries)]["accuracy"]


def _lr_lambda(cfg: BaseTrainConfig):
    warmup, total, floor = cfg.optim.warmup_steps, cfg.run.max_steps, cfg.optim.min_lr_ratio

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if cfg.optim.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def _autocast(cfg: BaseTrainConfig, device: torch.device):
    precision = cfg.run.precision
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16), "bf16"
    return contextlib.nullcontext(), "fp32"


# Scalars of an eval summary that TensorBoard plots (with the bootstrap's one-sided lower bound).
_TB_EVAL_KEYS = ("accuracy", "accuracy_tie_aware", "tie_rate", "margin_mean", "loss_mean")


def compile_blocks(model: torch.nn.Module) -> int:
    """`torch.compile` every repeated transformer block in place; returns how many.

    Blocks are the classes transformers lists in `_no_split_modules` (the units FSDP shards),
    so the embedding, head and loss stay eager. Shapes are dynamic because packed batches
    change their row count and the varlen kernel its longest-sequence argument every step.
    """
    blocks = transformer_blocks(model)
    if not blocks:
        raise UsageError(f"run.compile: {type(model).__name__} declares no transformer blocks to compile")
    import torch._inductor.config

    # torch 2.11's inductor asserts in its memory-coalescing tiling analysis on these dynamic
    # shapes (tiling_utils.get_pw_red_splits, seen on the H200); without the analysis it picks
    # tiles with its older heuristics.
    torch._inductor.config.triton.coalesce_tiling_analysis = False
    for block in blocks:
        block.compile(dynamic=True)
    return len(blocks)


def eval_shard(pairs: Sequence[TokenizedPair], rank: int, world_size: int) -> list[TokenizedPair]:
    """This rank's contiguous share of the probe. Every share has the same length (the last
    ones repeat the final pair, whose extra scores are dropped), so every rank runs the same
    number of forwards: FSDP2 needs every rank in every forward."""
    per_rank = -(-len(pairs) // world_size)
    return [pairs[min(i, len(pairs) - 1)] for i in range(rank * per_rank, (rank + 1) * per_rank)]


def seed_everything(seed: int, rank: int) -> None:
    random.seed(seed + rank)
    np.random.seed((seed + rank) % 2**32)
    torch.manual_seed(seed + rank)


def _step_metrics(sums: torch.Tensor, *, step: int, grad_norm: float, lr: float, seconds: float) -> dict:
    s = dict(zip(_SUMS, sums.tolist(), strict=True))
    n = s["pairs"]

    def std(total: float, sq: float) -> float:
        return math.sqrt(max(0.0, sq / n - (total / n) ** 2))

    return {
        "step": step,
        "loss": s["loss"] / n,
        "accuracy": s["correct"] / n,
        "tie_rate": s["ties"] / n,
        "chosen_mean": s["c"] / n,
        "chosen_std": std(s["c"], s["c2"]),
        "rejected_mean": s["r"] / n,
        "rejected_std": std(s["r"], s["r2"]),
        "margin_mean": s["m"] / n,
        "margin_std": std(s["m"], s["m2"]),
        "grad_norm": grad_norm,
        "lr": lr,
        "pairs_per_s": n / seconds,
        "tokens_per_s": s["tokens"] / seconds,
        "padding_efficiency": s["tokens"] / max(1.0, s["slots"]),
        "pairs": int(n),
        "tokens": int(s["tokens"]),
    }


class Trainer:
    """State of one run; `fit()` runs it. Kept as an object so tests can inspect gradients."""

    def __init__(
        self,
        cfg: BaseTrainConfig,
        objective: Objective,
        *,
        train_pairs: Sequence[TokenizedPair],
        tokenizer: Any,
        train_pairs_sha256: str,
        eval_set: EvalSet | None = None,
        info: DistInfo | None = None,
        train_content: TrainingContent | None = None,
        prepared_manifest_sha256: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.objective = objective
        self.train_pairs = list(train_pairs)
        self.tokenizer = tokenizer
        self.train_pairs_sha256 = train_pairs_sha256
        self.train_content = train_content  # written beside every checkpoint (data.overlap)
        self.prepared_manifest_sha256 = prepared_manifest_sha256  # `data.prepared`'s manifest.json
        self.eval_set = eval_set
        self.info = info or init_distributed()
        self.run_dir = Path(cfg.run.run_dir)
        if cfg.run.num_threads:
            torch.set_num_threads(cfg.run.num_threads)
        seed_everything(cfg.run.seed, 0)  # identical initial weights on every rank
        self.autocast, self.precision = _autocast(cfg, self.info.device)
        model = objective.build_model(tokenizer)
        with self.autocast:  # a reference pass runs in training's precision
            objective.prepare(self.info.device)  # before the model takes its place on the device
        self.raw_model = model.to(self.info.device)
        if cfg.model.gradient_checkpointing:
            # a reward model checkpoints its backbone; a DPO policy is itself a PreTrainedModel.
            # transformers 5.2x renames the method (the old name warns and goes in v6).
            # Non-reentrant explicitly: the reentrant variant passes no gradient to a block whose
            # inputs do not require one, which is every block of a LoRA policy (frozen embedding).
            target = getattr(self.raw_model, "backbone", self.raw_model)
            enable = (
                getattr(target, "activation_checkpointing_enable", None)
                or target.gradient_checkpointing_enable
            )
            enable({"use_reentrant": False})
        self.raw_model.train()
        if cfg.run.compile:
            compile_blocks(self.raw_model)
        self.model = wrap_model(self.raw_model, self.info, cfg.run.parallel)
        seed_everything(cfg.run.seed, self.info.rank)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.raw_model.parameters() if p.requires_grad],
            lr=cfg.optim.lr,
            betas=tuple(cfg.optim.betas),
            eps=cfg.optim.eps,
            weight_decay=cfg.optim.weight_decay,
            # one multi-tensor CUDA kernel per step instead of several foreach passes
            fused=self.info.device.type == "cuda",
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _lr_lambda(cfg))
        self.sampler = PairSampler(
            [p.num_tokens for p in self.train_pairs],
            global_batch_pairs=cfg.run.global_batch_pairs,
            world_size=self.info.world_size,
            grad_accum=cfg.run.grad_accum,
            seed=cfg.run.seed,
        )
        self.step = 0
        self.pairs_consumed = 0
        self.eval_summaries: dict[int, dict[str, Any]] = {}
        self.step0_eval: dict[str, Any] | None = None
        self._extra_sums: dict[str, torch.Tensor] = {}
        self._tb = None

    # ---- one optimizer step -------------------------------------------------------------
    def forward_backward(self) -> torch.Tensor:
        """Accumulate the next step's gradients on this rank; return its local metric sums."""
        info, cfg = self.info, self.cfg
        plan = self.sampler.next_step()[info.rank]
        scale = info.world_size / cfg.run.global_batch_pairs
        sums = torch.zeros(len(_SUMS), dtype=torch.float64, device=info.device)
        self._extra_sums = {}
        for i, indices in enumerate(plan):
            pairs = [self.train_pairs[j] for j in indices]
            with grad_sync(self.model, enabled=i == len(plan) - 1), self.autocast:
                out = self.objective.micro_batch(self.model, pairs, info.device)
                (out.loss_sum * scale).backward()
            # Stays on the device: one host sync per step (in train_step), not one per statistic.
            c, r = out.chosen.double(), out.rejected.double()
            m = c - r
            counts = torch.tensor([len(pairs), out.num_tokens, out.num_slots], dtype=torch.float64)
            sums += torch.stack(
                [
                    out.loss_sum.detach().double(),
                    counts[0].to(info.device),
                    (m > 0).sum().double(),
                    (m.abs() <= TIE_TOLERANCE).sum().double(),
                    c.sum(),
                    (c * c).sum(),
                    r.sum(),
                    (r * r).sum(),
                    m.sum(),
                    (m * m).sum(),
                    counts[1].to(info.device),
                    counts[2].to(info.device),
                ]
            )
            for key, values in out.extra.items():
                total = values.detach().double().sum()
                self._extra_sums[key] = self._extra_sums[key] + total if key in self._extra_sums else total
        return sums

    def train_step(self) -> dict[str, Any]:
        started = time.perf_counter()
        cfg = self.cfg
        sums = self.forward_backward()
        max_norm = cfg.optim.max_grad_norm
        params = [p for p in self.raw_model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else float("inf"))
        if hasattr(norm, "full_tensor"):  # FSDP2 returns a DTensor
            norm = norm.full_tensor()
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.pairs_consumed += cfg.run.global_batch_pairs
        names = sorted(self._extra_sums)  # the same keys on every rank: one objective
        if names:
            sums = torch.cat([sums, torch.stack([self._extra_sums[k] for k in names])])
        sums = all_reduce_sum(sums).cpu()
        seconds = max(1e-9, time.perf_counter() - started)
        metrics = _step_metrics(
            sums[: len(_SUMS)], step=self.step, grad_norm=float(norm), lr=lr, seconds=seconds
        )
        pairs = float(sums[_SUMS.index("pairs")])
        metrics.update({k: v / pairs for k, v in zip(names, sums[len(_SUMS) :].tolist(), strict=True)})
        return with_trl_names(metrics)

    # ---- evaluation ---------------------------------------------------------------------
    def batch_plan(self) -> dict[str, Any]:
        plan = {
            "batch_size": self.cfg.run.eval_batch_size,
            "layout": self.cfg.run.layout,
            "precision": self.precision,
            "device_type": self.info.device.type,
        }
        if self.info.world_size > 1:  # the probe is split across ranks, which changes the batches
            plan["eval_ranks"] = self.info.world_size
        return plan

    def _score_probe(
        self, pairs: Sequence[TokenizedPair]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(chosen, rejected, losses) for every probe pair in order; each rank scores one share."""
        world = self.info.world_size
        shard = eval_shard(pairs, self.info.rank, world) if world > 1 else pairs
        with self.autocast:
            chosen, rejected, losses = self.objective.score(
                self.raw_model, shard, self.cfg.run.eval_batch_size
            )
        if world == 1:
            return chosen, rejected, losses
        parts = all_gather_objects((chosen, rejected, losses))
        n = len(pairs)

        def joined(k: int) -> np.ndarray:
            return np.concatenate([part[k] for part in parts])[:n]

        return joined(0), joined(1), None if losses is None else joined(2)

    def evaluate(self, *, final: bool = False) -> dict[str, Any] | None:
        """Score the frozen eval set and write RUN/eval/step-NNNNNNN/ (ranks share the scoring; rank 0 writes)."""
        from rewardplane.eval.artifacts import assert_same_contract, eval_step_dir, write_eval_artifacts

        if self.eval_set is None:
            return None
        pairs, probe_sha = self.eval_set.pairs, self.eval_set.probe_sha256
        plan = self.batch_plan()
        if final and self.step0_eval is not None:
            # Refuse before scoring: a final number on other pairs or batches is another experiment.
            assert_same_contract(
                self.step0_eval, {"probe_sha256": probe_sha, "n_pairs": len(pairs), "batch_plan": plan}
            )
        chosen, rejected, losses = self._score_probe(pairs)
        summary = None
        if self.info.is_main:
            summary = write_eval_artifacts(
                eval_step_dir(self.run_dir, self.step),
                pair_ids=[p.pair_id for p in pairs],
                chosen_scores=chosen,
                rejected_scores=rejected,
                subsets=[p.subset for p in pairs],
                probe_sha256=probe_sha,
                objective=self.objective.name,
                model_identity={**self.objective.checkpoint_metadata(), "step": self.step},
                batch_plan=plan,
                pair_losses=losses,
                overlap=self.eval_set.overlap,
            )
            self.eval_summaries[self.step] = summary
            # strict accuracy counts ties as wrong: at step 0 a DPO policy equals its reference, so every
            # margin is exactly 0 (strict 0.0, tie-aware 0.5); the line says which it is
            log.info(
                "eval step %d: accuracy %.4f (tie-aware %.4f, ties %.1f%%) on %d pairs",
                self.step,
                summary["accuracy"],
                summary["accuracy_tie_aware"],
                100.0 * summary["tie_rate"],
                len(pairs),
            )
            if self._tb is not None:
                values = {f"eval/{key}": summary[key] for key in _TB_EVAL_KEYS}
                values["eval/accuracy_lower_95"] = summary["bootstrap"]["strict"]["lower_95"]
                self._tb.log(values, self.step)
        if self.step == 0:
            self.step0_eval = {"probe_sha256": probe_sha, "n_pairs": len(pairs), "batch_plan": plan}
        return summary

    # ---- checkpoints --------------------------------------------------------------------
    def save(self) -> Path | None:
        meta = {
            **self.objective.checkpoint_metadata(),
            "pairs_consumed": self.pairs_consumed,
            "train_pairs_sha256": self.train_pairs_sha256,
            "prepared_manifest_sha256": self.prepared_manifest_sha256,
            # where scores are read (rewardplane.data.tokenize.SCORE_POSITIONS); loads honour it
            "score_position": self.cfg.data.score_position,
            # how plain-text rows were tokenised (rewardplane.data.tokenize.PLAIN_TEXT_MODES); eval
            # refuses a probe that tokenises them otherwise
            "plain_text": self.cfg.data.plain_text,
        }
        state = {
            "step": self.step,
            "pairs_consumed": self.pairs_consumed,
            "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "step0_eval": self.step0_eval,
            "config": self.cfg.model_dump(mode="json"),  # what a resume must match (train.resume)
        }
        files = {}
        if self.train_content is not None:
            files[TRAINING_DATA_FILE] = self.train_content.to_bytes()
            meta["training_data"] = self.train_content.metadata(files[TRAINING_DATA_FILE])
        return ckpt.save_checkpoint(
            self.run_dir,
            step=self.step,
            info=self.info,
            model=self.raw_model,
            optimizer=self.optimizer,
            write_model=lambda d, sd: self.objective.write_model(d, sd, self.tokenizer),
            metadata=meta,
            trainer_state=state,
            keep_last=self.cfg.run.keep_last,
            files=files,
        )

    def resume(self, directory: str | Path, *, allow_new_data: bool = False) -> None:
        """Restore model, optimizer, scheduler, sampler position and every rank's RNG, or refuse
        a resume that would not continue the same experiment (`rewardplane.train.resume`)."""
        restore(self, Path(directory), allow_new_data=allow_new_data)

    # ---- the loop -----------------------------------------------------------------------
    def _log_metrics(self, metrics: dict[str, Any]) -> None:
        with open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps(metrics, allow_nan=True) + "\n")
        if self._tb is not None:
            self._tb.log({f"train/{k}": v for k, v in metrics.items() if k != "step"}, metrics["step"])

    def train_summary(self, started: tuple[float, int], final: dict[str, Any] | None) -> dict[str, Any]:
        """Transformers Trainer's end-of-training line (what RewardTrainer prints), from metrics.jsonl:
        runtime, samples and steps per second, mean training loss, epochs, and the final evaluation."""
        seconds = time.perf_counter() - started[0]
        steps = self.step - started[1]
        rows = []
        path = self.run_dir / "metrics.jsonl"
        if path.is_file():
            rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
        losses = [r["loss"] for r in rows if isinstance(r.get("loss"), int | float)]
        summary = {
            "train_runtime": round(seconds, 4),
            "train_samples_per_second": round(steps * self.cfg.run.global_batch_pairs / seconds, 3)
            if seconds > 0
            else None,
            "train_steps_per_second": round(steps / seconds, 3) if seconds > 0 else None,
            "train_loss": sum(losses) / len(losses) if losses else None,
            "epoch": round(self.pairs_consumed / max(1, len(self.train_pairs)), 4),
            "global_step": self.step,
        }
        if final is not None:
            summary["eval_accuracy"] = final["accuracy"]
            summary["eval_accuracy_lower_95"] = final["bootstrap"]["strict"]["lower_95"]
        return summary

    def fit(self) -> RunResult:
        cfg, info = self.cfg, self.info
        if info.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_text(self.run_dir / "config.yaml", dump_yaml(cfg))
            report_to = check_report_to(list(cfg.run.report_to))
            if cfg.run.tensorboard:  # the older switch: the same as report_to: [tensorboard]
                report_to.append("tensorboard")
            if [name for name in report_to if name != "none"]:
                self._tb = Trackers(report_to, run_dir=self.run_dir, config=cfg.model_dump(mode="json"))
        progress = None
        if info.is_main and cfg.run.progress:
            # a live bar on a terminal; otherwise one line every run.progress_every_s seconds
            progress = Progress(
                cfg.run.max_steps, "train", unit="step", initial=self.step, every_s=cfg.run.progress_every_s
            )
        metrics: dict[str, Any] = {}
        last_saved = None
        started = (time.perf_counter(), self.step)
        try:
            if self.step == 0:
                self.evaluate()
            while self.step < cfg.run.max_steps:
                metrics = self.train_step()
                if not math.isfinite(metrics["loss"]):
                    raise FloatingPointError(f"non-finite loss at step {self.step}")
                if info.is_main:
                    self._log_metrics(metrics)
                if progress is not None:
                    progress.update(1, loss=f"{metrics['loss']:.4f}", acc=f"{metrics['accuracy']:.3f}")
                if (
                    cfg.run.save_every
                    and self.step % cfg.run.save_every == 0
                    and self.step < cfg.run.max_steps
                ):
                    last_saved = self.save()
                if (
                    cfg.run.eval_every
                    and self.step % cfg.run.eval_every == 0
                    and self.step < cfg.run.max_steps
                ):
                    self.evaluate()
            last_saved = self.save()
            final_summary = self.evaluate(final=True)
            if info.is_main:
                log.info("train summary: %s", json.dumps(self.train_summary(started, final_summary)))
        except KeyboardInterrupt:  # the CLI says what survives and how to resume (train.resume)
            raise TrainingInterrupted(self.run_dir, self.step, cfg.run.max_steps) from None
        finally:
            if progress is not None:
                progress.close()
            if self._tb is not None:
                self._tb.close()
        return RunResult(
            run_dir=self.run_dir,
            step=self.step,
            checkpoint=last_saved,
            last_metrics=metrics,
            eval_summaries=self.eval_summaries,
        )


def train_objective(
    cfg: BaseTrainConfig,
    objective: Objective,
    data: PreparedData,
    *,
    resume: str | None = None,
    allow_new_data: bool = False,
    overwrite: bool = False,
) -> RunResult:
    """What every recipe runs: the one loop over prepared data, resumed from a checkpoint
    directory or the run's latest one (`resume="auto"`), then trained, checkpointed, evaluated.

    A fresh run (no `resume`) into a non-empty run directory is refused unless `overwrite`,
    which empties it first: appending to another run's metrics and checkpoints mixes two runs.
    """
    prepare_run_dir(Path(cfg.run.run_dir), resume=resume, overwrite=overwrite)
    trainer = Trainer(
        cfg,
        objective,
        train_pairs=data.train,
        tokenizer=data.tokenizer,
        train_pairs_sha256=data.train_pairs_sha256,
        eval_set=EvalSet(data.eval, data.probe_sha256, data.eval_overlap) if data.eval else None,
        train_content=data.train_content,
        prepared_manifest_sha256=data.prepared_manifest_sha256,
    )
    resume = resolve_resume(Path(cfg.run.run_dir), resume)
    if resume:
        trainer.resume(resume, allow_new_data=allow_new_data)
    return trainer.fit()
