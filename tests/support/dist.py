"""Single-process and multi-process (gloo, CPU) helpers for distributed tests."""

from __future__ import annotations

import socket

import torch

from rewardplane.train.distributed import DistInfo

SOLO = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
