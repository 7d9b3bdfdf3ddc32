"""Worker for the multi-process (gloo, CPU) gradient and FSDP2 parity tests."""

from __future__ import annotations

import os
import sys

import torch


def worker(rank: int, world: int, port: int, out: str, parallel: str, mode: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    sys.path.insert(0, os.path.dirname(__file__))
    import torch.distributed as dist

    from _rm_helpers import make_trainer, train_config

    cfg = train_config(os.path.join(out, "run"), run={"parallel": parallel, "max_steps": 3, "grad_accum": 1})
    trainer = make_trainer(cfg)
    if mode == "grad":
        trainer.forward_backward()
        grads = {}
        for name, p in trainer.raw_model.named_parameters():
            g = p.grad
            grads[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()
        result = grads
    else:
        result = [trainer.train_step()["loss"] for _ in range(3)]
    if rank == 0:
        torch.save(result, os.path.join(out, f"{parallel}-{mode}.pt"))
    dist.barrier()
    dist.destroy_process_group()
