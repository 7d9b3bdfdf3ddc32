"""Worker for the multi-process (gloo, CPU) gradient, FSDP2 and sharded-evaluation parity tests."""

from __future__ import annotations

import gc
import json
import os
import sys

import torch

EVAL_PAIRS = 11  # odd, so the second rank's share ends with a repeated pair


def worker(rank: int, world: int, port: int, out: str, parallel: str, mode: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
    import torch.distributed as dist

    from support.rm import make_trainer, train_config

    run_dir = os.path.join(out, "run-resumed" if mode == "resume" else "run")
    cfg = train_config(run_dir, run={"parallel": parallel, "max_steps": 4, "grad_accum": 1})
    if mode in ("uninterrupted", "resume"):
        trainer = make_trainer(cfg)
        if mode == "resume":
            trainer.resume(os.path.join(out, "run", "checkpoints", "step-0000002"))
        result = {}
        while trainer.step < 4:
            loss = trainer.train_step()["loss"]
            result[trainer.step] = loss  # the step just taken
            if mode == "uninterrupted" and trainer.step == 2:
                trainer.save()  # collective: every rank takes part
    elif mode == "eval":
        from support.rm import random_pairs

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
    if rank == 0 and mode in ("eval", "uninterrupted", "resume"):
        with open(os.path.join(out, f"{parallel}-{mode}.json"), "w") as handle:
            json.dump(result, handle)
    elif rank == 0:
        torch.save(result, os.path.join(out, f"{parallel}-{mode}.pt"))
    # Free the trainer (DDP's reducer holds the process group) while the group is alive: freed
    # after destroy_process_group, the reducer's gloo teardown can deadlock on the GIL.
    del trainer
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
