"""Worker for the two-rank (gloo, CPU) LoRA DPO test: DDP over a peft policy."""

from __future__ import annotations

import gc
import os
import sys

import torch


def lora_trainer(run_dir: str, info=None, parallel: str = "ddp", overrides: tuple[str, ...] = ()):
    """A Trainer over the LoRA test config; later `overrides` win over the defaults here."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
    from rewardplane.objectives.base import TrainPairs
    from rewardplane.train.data import prepare_data
    from rewardplane.train.loop import Trainer
    from rewardplane.train.recipe import build_objective
    from support.dpo import lora_config

    cfg = lora_config(
        run_dir, "run.max_steps=2", "run.global_batch_pairs=8", f"run.parallel={parallel}", *overrides
    )
    data = prepare_data(cfg)
    objective = build_objective(cfg, TrainPairs(data.train, data.train_pairs_sha256))
    return Trainer(
        cfg, objective, train_pairs=data.train, tokenizer=data.tokenizer, train_pairs_sha256="x", info=info
    )


def adapters(trainer) -> dict[str, torch.Tensor]:
    """Trainable tensors by name, whole (FSDP2 holds each rank's shard as a DTensor)."""
    from torch.distributed.tensor import DTensor

    def whole(p):
        return p.full_tensor() if isinstance(p, DTensor) else p

    return {n: whole(p.detach()).clone() for n, p in trainer.raw_model.named_parameters() if p.requires_grad}


def worker(rank: int, world: int, port: int, out: str, parallel: str = "ddp") -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    import torch.distributed as dist

    trainer = lora_trainer(os.path.join(out, "run"), parallel=parallel)
    from torch.distributed.fsdp import FSDPModule

    sharded = sum(isinstance(m, FSDPModule) for m in trainer.raw_model.modules())
    losses = [trainer.train_step()["loss"] for _ in range(2)]
    result = {"losses": losses, "adapters": adapters(trainer), "sharded_modules": sharded}
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    del trainer  # before the group goes: DDP's reducer holds it (see _rm_dist_worker.py)
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
