"""Background sampling of GPU utilisation/memory (NVML) and host CPU utilisation.

The regime label (`gpu_bound` vs `host_bound`) is what makes a throughput number
interpretable: a layout comparison on a host-bound service measures Python and JSON, not the
GPU. NVML is optional: without nvidia-ml-py, a driver or a GPU, the monitor records why and
reports only host CPU, and nothing else changes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

GPU_BOUND_UTIL = 70.0
"""Mean GPU utilisation (percent) at or above which a point is labelled gpu_bound."""


@dataclass(frozen=True)
class GpuSample:
    index: int
    util: float
    mem_used_mb: float
    mem_total_mb: float


@dataclass(frozen=True)
class Sample:
    t: float  # time.perf_counter()
    cpu_util: float | None
    gpus: tuple[GpuSample, ...]


def _read_cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies from /proc/stat, or None off Linux."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    values = [int(v) for v in fields[:8]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values)
    return total - idle, total


def _load_nvml() -> tuple[ModuleType | None, str | None]:
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError subclasses vary by driver state
        return None, f"NVML unavailable: {exc}"
    return pynvml, None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class ResourceMonitor:
    """Samples every `interval_s` on a daemon thread between start() and stop().

    `gpu_indices` restricts sampling to the GPUs a deployment holds (None: all visible).
    `nvml` injects an NVML module (tests); by default nvidia-ml-py is imported if present.
    """

    def __init__(
        self,
        interval_s: float = 0.5,
        gpu_indices: Sequence[int] | None = None,
        nvml: ModuleType | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        if nvml is None:
            nvml, self.gpu_unavailable_reason = _load_nvml()
        else:
            self.gpu_unavailable_reason = None
        self._nvml = nvml
        self._handles: list[tuple[int, Any]] = []
        if nvml is not None:
            count = nvml.nvmlDeviceGetCount()
            indices = range(count) if gpu_indices is None else [i for i in gpu_indices if i < count]
            self._handles = [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in indices]
            if not self._handles:
                self.gpu_unavailable_reason = "no GPU visible to NVML"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu_previous = _read_cpu_times()

    @property
    def gpu_available(self) -> bool:
        return bool(self._handles)

    def gpu_info(self) -> dict[str, Any]:
        """Name, count, driver and driver CUDA version of the sampled GPUs."""
        if not self.gpu_available:
            return {"available": False, "reason": self.gpu_unavailable_reason, "count": 0, "names": []}
        nvml = self._nvml
        cuda = nvml.nvmlSystemGetCudaDriverVersion_v2()
        return {
            "available": True,
            "reason": None,
            "count": len(self._handles),
            "indices": [i for i, _ in self._handles],
            "names": [_text(nvml.nvmlDeviceGetName(h)) for _, h in self._handles],
            "driver": _text(nvml.nvmlSystemGetDriverVersion()),
            "cuda_driver": f"{cuda // 1000}.{(cuda % 1000) // 10}",
        }

    def _sample_gpus(self) -> tuple[GpuSample, ...]:
        out = []
        for index, handle in self._handles:
            util = self._nvml.nvmlDeviceGetUtilizationRates(handle)
            mem = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            out.append(GpuSample(index, float(util.gpu), mem.used / 2**20, mem.total / 2**20))
        return tuple(out)

    def sample_once(self) -> Sample:
        """Take one sample now (CPU utilisation is over the time since the previous one)."""
        current = _read_cpu_times()
        previous, self._cpu_previous = self._cpu_previous, current
        cpu = None
        if previous is not None and current is not None and current[1] > previous[1]:
            cpu = 100.0 * (current[0] - previous[0]) / (current[1] - previous[1])
        sample = Sample(time.perf_counter(), cpu, self._sample_gpus())
        self.samples.append(sample)
        return sample

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample_once()

    def start(self) -> ResourceMonitor:
        self._thread = threading.Thread(target=self._run, name="rewardplane-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> ResourceMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def summarize(self, intervals: Sequence[tuple[float, float]]) -> dict[str, Any]:
        """Mean/max over the samples inside any of `intervals`, plus the regime label."""
        inside = [s for s in self.samples if any(a <= s.t <= b for a, b in intervals)]
        cpu = [s.cpu_util for s in inside if s.cpu_util is not None]
        util = [g.util for s in inside for g in s.gpus]
        mem = [g.mem_used_mb for s in inside for g in s.gpus]
        util_mean = float(np.mean(util)) if util else None
        if util_mean is None:
            regime = "unknown"
        else:
            regime = "gpu_bound" if util_mean >= GPU_BOUND_UTIL else "host_bound"
        return {
            "samples": len(inside),
            "gpu_util_mean": util_mean,
            "gpu_util_max": float(np.max(util)) if util else None,
            "gpu_mem_used_mb_mean": float(np.mean(mem)) if mem else None,
            "gpu_mem_used_mb_max": float(np.max(mem)) if mem else None,
            "cpu_util_mean": float(np.mean(cpu)) if cpu else None,
            "cpu_util_max": float(np.max(cpu)) if cpu else None,
            "regime": regime,
        }

    def timeline(self, origin: float) -> list[dict[str, Any]]:
        """All samples relative to `origin` (seconds): the GPU-utilisation-over-time plot's data."""
        return [
            {
                "t": round(s.t - origin, 3),
                "cpu_util": s.cpu_util,
                "gpu_util": [g.util for g in s.gpus],
                "gpu_mem_used_mb": [round(g.mem_used_mb, 1) for g in s.gpus],
            }
            for s in self.samples
        ]
