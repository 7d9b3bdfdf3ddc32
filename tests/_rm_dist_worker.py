"""Worker for the multi-process (gloo, CPU) gradient, FSDP2 and sharded-evaluation parity tests."""

from __future__ import annotations

import json
import os
import sys

import torch

EVAL_PAIRS = 11  # odd, so the second rank's share ends with a repeated pair


def worker(rank: int, world: int, port: int, out: str, parallel: str, mode: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    sys.path.insert(0, os.path.dirname(__file__))
    import torch.distributed as dist

    from _rm_helpers import make_trainer, train_config

    cfg = train_config(os.path.join(out, "run"), run={"parallel": parallel, "max_steps": 3, "grad_accum": 1})
    if mode == "eval":
        from _rm_helpers import random_pairs

        trainer = make_trainer(cfg, eval_pairs=random_pairs(EVAL_PAIRS, seed=5, max_len=20))
        scored: list[int] = []
        score = trainer.objective.score
        trainer.objective.score = lambda model, pairs, bs: (
            scored.append(len(pairs)) or score(model, pairs, bs)
        )
        summary = trainer.evaluate()
        scored_per_rank = [0] * world
        dist.all_gather_object(scored_per_rank, scored)
        result = {"summary": summary, "scored_per_rank": scored_per_rank}
    else:
        trainer = make_trainer(cfg)
    if mode == "grad":
        trainer.forward_backward()
        grads = {}
        for name, p in trainer.raw_model.named_parameters():
            g = p.grad
            grads[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()
        result = grads
    elif mode == "loss":
        result = [trainer.train_step()["loss"] for _ in range(3)]
    if rank == 0 and mode == "eval":
        with open(os.path.join(out, f"{parallel}-eval.json"), "w") as handle:
            json.dump(result, handle)
    elif rank == 0:
        torch.save(result, os.path.join(out, f"{parallel}-{mode}.pt"))
    dist.barrier()
    dist.destroy_process_group()
