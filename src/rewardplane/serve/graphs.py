"""CUDA-graph replays of a model tower at fixed batch sizes (the `cuda_graphs` scorer option).

Why: an eager forward of a large tower is hundreds of kernel launches issued by Python, one
module at a time, with the GIL held. Inside the service that host time competes for the GIL with
the event loop, JSON parsing and the image threads, so under load the host launches more slowly
than the GPU computes. A captured graph is one launch per forward, whatever the host is doing.
The measurements: docs/benchmarks/serve.md, "H200 (measured 2026-12-03): decode-on-arrival,
multipart, CUDA graphs".

A graph has fixed shapes, so each tower is captured once per bucket size (powers of two to 16,
then steps of 16 up to `max_batch_size`) and a batch is padded up to the next bucket; a batch
larger than the largest bucket runs as several replays. Rows never interact in these towers
(attention and normalisation are per image, per text), so padding changes no real row beyond
the rounding a different GEMM shape may bring, the same as eager batching. The padded rows hold
earlier, finite inputs and their outputs are dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def bucket_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, 16, then every multiple of 16 up to `max_batch_size` (always included)."""
    sizes = [s for s in (1, 2, 4, 8, 16) if s < max_batch_size]
    sizes += list(range(32, max_batch_size, 16))
    return sorted({*sizes, max_batch_size})


class BucketGraphs:
    """`fn(*inputs)` captured as one CUDA graph per bucket size; calls pad to the next bucket.

    `make_inputs(n)` returns example inputs with leading dimension `n` (valid values: they are
    what the padded rows hold until real batches overwrite them). Every graph shares one
    memory pool, captured largest first so the smaller ones reuse its blocks. Call from the
    thread that replays: outputs are copied out before the next replay can overwrite them.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        make_inputs: Callable[[int], tuple[Any, ...]],
        sizes: list[int],
        *,
        device: str = "cuda",
        warmup: int = 2,
    ) -> None:
        import torch

        self.fn = fn
        self.sizes = sorted(sizes)
        self._graphs: dict[int, tuple[Any, tuple[Any, ...], Any]] = {}
        with torch.cuda.device(device), torch.inference_mode():
            self._pool = torch.cuda.graph_pool_handle()
            for n in reversed(self.sizes):
                self._graphs[n] = self._capture(make_inputs(n), warmup)

    def _capture(self, inputs: tuple[Any, ...], warmup: int):
        import torch

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # lazy init (cuBLAS handles, workspaces) happens outside the capture
            for _ in range(warmup):
                self.fn(*inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's CUDA calls (image prefetch, a second scorer) are theirs
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            out = self.fn(*inputs)
        return graph, inputs, out

    def __call__(self, *args):
        import torch

        n = args[0].shape[0]
        largest = self.sizes[-1]
        if n > largest:
            chunks = [self(*(a[k : k + largest] for a in args)) for k in range(0, n, largest)]
            return torch.cat(chunks)
        size = next(s for s in self.sizes if s >= n)
        graph, inputs, out = self._graphs[size]
        for static, value in zip(inputs, args, strict=True):
            static[:n].copy_(value)
        graph.replay()
        return out[:n].clone()
