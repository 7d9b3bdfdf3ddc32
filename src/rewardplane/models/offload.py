"""Move a module's weights to pinned host memory and back, at copy-engine speed (`WeightOffloader`).

What a colocated reward model needs between RL phases: give its GPU memory to the trainer, and
be back fast, bit-for-bit the same, when the next rollout needs scoring.

How:
- Every parameter and buffer on the device (each tensor object once: tied weights stay tied)
  gets a fixed slot in one flat buffer per dtype (a "weight group"), 512-byte aligned like the
  CUDA caching allocator's blocks, with its own sizes and strides.
- The host side of each group is allocated once, at the first offload, and kept between cycles.
  On CUDA it is page-locked with `cudaHostRegister` on an ordinary host allocation (PyTorch's
  pinned allocator rounds every block up to a power of two: 16.1 GB of Llama-3.1-8B weights
  would pin 32 GiB); `pin="alloc"` uses `pin_memory=True` instead. The registration ends with
  the allocation, whoever frees it (`close()`, or the last tensor viewing it going away): a
  range freed while registered keeps the driver's mapping to its old physical pages, and every
  later host→device copy from memory the process reuses at that address read those stale pages
  (the GPU suite after the offload tests: a Pillow-decoded image reached the GPU as other pixels,
  a judge's and a CLIP scorer's weights as garbage).
- Onload allocates one device buffer per group and copies it in ONE host→device copy on a side
  stream (the copy engine, no kernels), then re-points every tensor object at its slot in it
  (`tensor.data = view`, so every reference to the parameter sees the move). Offload is one
  device→host copy per group (per tensor the first time, when they are still separate device
  allocations), then the tensors are re-pointed at the host buffer and the device memory is
  returned to the driver (`torch.cuda.empty_cache`, and cuBLAS workspaces).
- The values are copied, never converted, so scores after any number of cycles equal the first
  ones bit for bit (tested), as long as whatever reads the weights (CUDA graphs!) is rebuilt
  after an onload: the device addresses change. `rewardplane.serve.lifecycle` does that.

An onload that runs out of device memory (the trainer still holds it) raises `OnloadError` with
the bytes needed and free; the module stays offloaded and intact, and a retry can succeed.

On the CPU (tests) the same code runs with plain host buffers: real copies, real re-pointing,
no streams, no pinning.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger(__name__)

ALIGN_BYTES = 512
"""Slot alignment inside a group: the caching allocator's block granularity, so kernels see the
same pointer alignment (and pick the same algorithms) as with separately allocated weights."""

GiB = 1024**3


class OnloadError(RuntimeError):
    """An onload could not get the device memory it needs. The module is still offloaded (its
    tensors live in the host buffers, untouched) and a later onload may succeed."""

    def __init__(self, message: str, *, bytes_needed: int, bytes_free: int | None) -> None:
        super().__init__(message)
        self.bytes_needed = bytes_needed
        self.bytes_free = bytes_free


@dataclass(frozen=True)
class Transfer:
    """One offload or onload. `seconds` is wall time (allocation, copy, synchronisation,
    re-pointing); `copy_seconds` the copies alone (CUDA events on a GPU); `gbps` = bytes/copy."""

    direction: str
    bytes: int
    groups: int
    seconds: float
    copy_seconds: float
    copies: int
    pin_seconds: float = 0.0
    """Allocating and page-locking the host buffers (the first offload only)."""

    @property
    def gbps(self) -> float:
        return self.bytes / self.copy_seconds / 1e9 if self.copy_seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "gbps": round(self.gbps, 3)}


@dataclass
class _Slot:
    tensor: Any  # the module's own tensor object (parameter or buffer), re-pointed in place
    offset: int  # in elements of the group's dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass
class _Group:
    dtype: Any
    numel: int
    slots: list[_Slot]
    host: Any = None  # flat host buffer, allocated once and kept
    device: Any = None  # flat device buffer while resident after an onload (else None)
    registered: Any = None  # the finalizer that unregisters `host` (cudaHostRegister), or None

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def _unregister(ptr: int) -> None:
    """End a `cudaHostRegister` (a finalizer: runs before the registered bytes are freed)."""
    import torch

    with contextlib.suppress(Exception):
        torch.cuda.cudart().cudaHostUnregister(ptr)


def _span(size: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Elements of storage a tensor with these sizes and strides reaches."""
    if any(s == 0 for s in size):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(size, stride, strict=True))


def _align(n: int, itemsize: int) -> int:
    step = max(1, ALIGN_BYTES // itemsize)
    return (n + step - 1) // step * step


def _is_cuda(device: Any) -> bool:
    return getattr(device, "type", str(device).split(":")[0]) == "cuda"


class WeightOffloader:
    """Moves `module`'s parameters and buffers between `device` and host buffers kept between cycles.

    `extra` names further tensors (not parameters or buffers) that live on the device and must
    move with the weights. Not thread-safe: call from one thread (the scorer's). States:
    `resident` (on the device) and `offloaded` (in the host buffers).
    """

    def __init__(self, module: Any, *, device: Any = None, pin: str = "register", extra: tuple = ()) -> None:
        import torch

        if pin not in ("register", "alloc"):
            raise ValueError(f"pin must be 'register' or 'alloc', got {pin!r}")
        tensors: dict[int, Any] = {}
        for t in [*module.parameters(), *module.buffers(), *extra]:
            tensors.setdefault(id(t), t)
        if device is None:
            first = next(iter(tensors.values()), None)
            device = first.device if first is not None else torch.device("cpu")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.pin = pin
        self.cuda = _is_cuda(self.device)
        by_dtype: dict[Any, _Group] = {}
        for t in tensors.values():
            if t.device != self.device:
                continue  # lives elsewhere on purpose: not ours to move
            group = by_dtype.setdefault(t.dtype, _Group(t.dtype, 0, []))
            size, stride = tuple(t.shape), tuple(t.stride())
            group.slots.append(_Slot(t, group.numel, size, stride))
            group.numel = _align(group.numel + _span(size, stride), t.dtype.itemsize)
        self.groups = sorted(by_dtype.values(), key=lambda g: -g.nbytes)
        self.state = "resident"
        self._stream = None

    # --- what callers read -------------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        """Bytes moved per transfer (all groups, alignment padding included)."""
        return sum(g.nbytes for g in self.groups)

    @property
    def bytes_on_device(self) -> int:
        return self.nbytes if self.state == "resident" else 0

    def describe(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "bytes": self.nbytes,
            "groups": [
                {"dtype": str(g.dtype).removeprefix("torch."), "bytes": g.nbytes} for g in self.groups
            ],
            "tensors": sum(len(g.slots) for g in self.groups),
            "host_pinned": any(g.registered for g in self.groups) or (self.cuda and self.pin == "alloc"),
        }

    # --- transfers ---------------------------------------------------------------------------

    def offload(self, *, copy: bool = True) -> Transfer:
        """Weights to the host buffers; device memory back to the driver. A no-op when offloaded.

        `copy=False` skips the device→host copy when the host buffers already hold the current
        values (an onload that is being undone). Raises before anything moved, or not at all.
        """
        import torch

        started = time.perf_counter()
        if self.state == "offloaded":
            return Transfer("offload", 0, 0, 0.0, 0.0, 0)
        pin_started = time.perf_counter()
        for g in self.groups:
            if g.host is None:
                g.host = self._alloc_host(g)
        pin_s = time.perf_counter() - pin_started
        copies, copy_s = 0, 0.0
        if copy or any(g.device is None for g in self.groups):
            with self._timed() as timer:
                for g in self.groups:
                    if g.device is not None:  # views of one device buffer: one bulk copy
                        g.host.copy_(g.device, non_blocking=self.cuda)
                        copies += 1
                    else:  # first offload: still separate allocations
                        for s in g.slots:
                            self._view(g.host, s).copy_(s.tensor.data, non_blocking=self.cuda)
                            copies += 1
            copy_s = timer()
        with torch.no_grad():
            for g in self.groups:
                for s in g.slots:
                    s.tensor.data = self._view(g.host, s)
                g.device = None
        self.state = "offloaded"
        self.release_cache()
        elapsed = time.perf_counter() - started
        return Transfer("offload", self.nbytes, len(self.groups), elapsed, copy_s, copies, pin_s)

    def onload(self) -> Transfer:
        """Weights back on the device: one buffer and one host→device copy per group. A no-op when
        resident. On out-of-memory: `OnloadError`, nothing changed."""
        import torch

        started = time.perf_counter()
        if self.state == "resident":
            return Transfer("onload", 0, 0, 0.0, 0.0, 0)
        buffers = []
        try:
            for g in self.groups:
                buffers.append(torch.empty(g.numel, dtype=g.dtype, device=self.device))
        except torch.OutOfMemoryError as exc:
            buffers.clear()
            self.release_cache()
            free = None
            if self.cuda:
                with contextlib.suppress(Exception):
                    free = int(torch.cuda.mem_get_info(self.device)[0])
            need = self.nbytes
            raise OnloadError(
                f"onload needs {need / GiB:.2f} GiB ({need} bytes) on {self.device}"
                + (f", {free / GiB:.2f} GiB ({free} bytes) free" if free is not None else "")
                + f": {str(exc).splitlines()[0][:200]}",
                bytes_needed=need,
                bytes_free=free,
            ) from None
        with self._timed() as timer:
            for g, buf in zip(self.groups, buffers, strict=True):
                buf.copy_(g.host, non_blocking=self.cuda)
        copy_s = timer()
        with torch.no_grad():
            for g, buf in zip(self.groups, buffers, strict=True):
                for s in g.slots:
                    s.tensor.data = self._view(buf, s)
                g.device = buf
        self.state = "resident"
        elapsed = time.perf_counter() - started
        return Transfer("onload", self.nbytes, len(self.groups), elapsed, copy_s, len(self.groups))

    def release_cache(self) -> None:
        """Return cached, unused device memory to the driver (what NVML then sees as free)."""
        if not self.cuda:
            return
        import torch

        torch.cuda.synchronize(self.device)
        with contextlib.suppress(Exception):  # private API; present in every supported torch
            torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()

    def close(self) -> None:
        """Unpin the host buffers (onload first if the module must stay usable)."""
        if self.state == "offloaded":
            self.onload()
        for g in self.groups:
            if g.registered is not None:
                g.registered()  # unregisters now, once
                g.registered = None
            g.host = None

    # --- internals ---------------------------------------------------------------------------

    @staticmethod
    def _view(flat: Any, slot: _Slot) -> Any:
        return flat.as_strided(slot.size, slot.stride, slot.offset)

    def _alloc_host(self, g: _Group) -> Any:
        import torch

        if not self.cuda:
            return torch.empty(g.numel, dtype=g.dtype)
        if self.pin == "register":
            import numpy as np

            # numpy owns the bytes and torch views them (the storage keeps the array alive), so the
            # array dies exactly when the last tensor on it does: its finalizer unregisters the
            # range before numpy frees it (see the module docstring: never freed while registered)
            raw = np.empty(max(1, g.nbytes), dtype=np.uint8)
            host = torch.from_numpy(raw)
            # Touch every page first, on all cores: registering untouched memory faults the pages in
            # one by one (measured on the H200's host: 6.5 s for 15 GB, against 0.7 + 0.7 s this way).
            host.zero_()
            err = torch.cuda.cudart().cudaHostRegister(host.data_ptr(), max(1, g.nbytes), 0)
            if int(err) == 0:
                g.registered = weakref.finalize(raw, _unregister, host.data_ptr())
                g.registered.atexit = False  # the process's memory goes with it anyway
                return host[: g.nbytes].view(g.dtype)
            log.warning("cudaHostRegister failed (%s); pinning with pin_memory=True instead", err)
        return torch.empty(g.numel, dtype=g.dtype, pin_memory=True)

    @contextlib.contextmanager
    def _timed(self):
        """Run the copies on a side stream (CUDA) and time them; yields a getter of the seconds."""
        import torch

        result = [0.0]
        if not self.cuda:
            t0 = time.perf_counter()
            yield lambda: result[0]
            result[0] = time.perf_counter() - t0
            return
        with torch.cuda.device(self.device):
            if self._stream is None:
                self._stream = torch.cuda.Stream(self.device)
            current = torch.cuda.current_stream(self.device)
            self._stream.wait_stream(current)  # weights written on the compute stream first
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(self._stream):
                begin.record()
                yield lambda: result[0]
                end.record()
            current.wait_stream(self._stream)  # compute after the copies
            end.synchronize()
            result[0] = begin.elapsed_time(end) / 1000.0


def device_memory(device: Any = None) -> dict[str, Any]:
    """What the device holds for this process: torch's allocated/reserved bytes and, when NVML is
    there, the process's own GPU memory (what a colocated trainer can get back) and the device's."""
    import os

    import torch

    if not torch.cuda.is_available():
        return {"device": "cpu"}
    device = torch.device(device if device is not None else "cuda")
    index = device.index if device.index is not None else torch.cuda.current_device()
    out: dict[str, Any] = {
        "device": f"cuda:{index}",
        "torch_allocated_bytes": int(torch.cuda.memory_allocated(index)),
        "torch_reserved_bytes": int(torch.cuda.memory_reserved(index)),
    }
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            uuid = str(torch.cuda.get_device_properties(index).uuid)
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            out["nvml_device_used_bytes"] = int(info.used)
            out["nvml_device_total_bytes"] = int(info.total)
            pid = os.getpid()
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == pid and proc.usedGpuMemory is not None:
                    out["nvml_process_used_bytes"] = int(proc.usedGpuMemory)
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # no nvidia-ml-py, no driver access, a container without a pid view
        out["nvml_error"] = f"{type(exc).__name__}: {exc}"[:200]
    return out
