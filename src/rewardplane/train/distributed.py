"""Process-group setup, DDP / FSDP2 wrapping and small collectives.

Works unchanged under `torchrun` (env:// rendezvous), in a `torch.multiprocessing.spawn` test
(gloo on CPU) and single-process (world size 1, no process group). Both wrappers average
gradients over ranks; the loop multiplies its loss by the world size so the result is the
*sum* over ranks divided by the global pair count.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed() -> DistInfo:
    """Join the process group described by the environment (WORLD_SIZE > 1), else run alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    if dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank, device=device)


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a transformers model: the classes it lists in `_no_split_modules`.

    They are the units FSDP2 shards (one all-gather per block instead of the whole model at
    once) and `run.compile` compiles. Found by class, not by attribute path, so a reward model's
    `backbone`, a causal LM's `model.layers`, an encoder's `encoder.layer` and a peft wrapper
    around any of them all resolve.
    """
    backbone = getattr(model, "backbone", model)
    names = set(getattr(backbone, "_no_split_modules", None) or ())
    return [module for module in backbone.modules() if type(module).__name__ in names]


def wrap_model(model: nn.Module, info: DistInfo, parallel: str) -> nn.Module:
    """DDP or FSDP2 (`fully_shard` per transformer block, then the root) when world_size > 1."""
    if not info.enabled:
        return model
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [info.device.index] if info.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)
    if parallel == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in transformer_blocks(model):
            fully_shard(block)
        fully_shard(model)
        return model
    raise ValueError(f"unknown parallel mode {parallel!r}")


@contextlib.contextmanager
def grad_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce on all but the last accumulation micro-batch."""
    if enabled:
        yield
        return
    if hasattr(model, "no_sync"):  # DDP
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def all_gather_objects(obj: object) -> list[object]:
    if not dist.is_initialized():
        return [obj]
    out: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def broadcast_object(obj: object) -> object:
    """Rank 0's value on every rank (a decision only rank 0 can make, e.g. a filesystem check)."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
