from types import SimpleNamespace

from rewardplane.bench.gpu_monitor import ResourceMonitor


class FakeNvml:
    """The handful of pynvml calls the monitor makes, with scripted utilisation."""

    def __init__(self, utils):
        self.utils = list(utils)

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=self.utils.pop(0))

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=2**30 * (handle + 1), total=2**34)

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H200"

    def nvmlSystemGetDriverVersion(self):
        return "580.1"

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return 13000


def test_gpu_bound_and_host_bound_labels():
    monitor = ResourceMonitor(gpu_indices=[1], nvml=FakeNvml([90, 80, 20]))
    samples = [monitor.sample_once() for _ in range(3)]
    assert [s.gpus[0].index for s in samples] == [1, 1, 1]
    everything = monitor.summarize([(samples[0].t, samples[-1].t)])
    assert everything["samples"] == 3 and everything["gpu_util_mean"] == 190 / 3
    assert everything["regime"] == "host_bound"  # 63% < 70%
    first_two = monitor.summarize([(samples[0].t, samples[1].t)])
    assert first_two["regime"] == "gpu_bound" and first_two["gpu_util_max"] == 90
    assert first_two["gpu_mem_used_mb_mean"] == 2048
    info = monitor.gpu_info()
    assert info == {
        "available": True, "reason": None, "count": 1, "indices": [1],
        "names": ["NVIDIA H200"], "driver": "580.1", "cuda_driver": "13.0",
    }  # fmt: skip
    assert monitor.timeline(samples[0].t)[0]["gpu_util"] == [90]


def test_without_nvml_only_host_cpu(monkeypatch):
    from rewardplane.bench import gpu_monitor

    monkeypatch.setattr(gpu_monitor, "_load_nvml", lambda: (None, "NVML unavailable: no driver"))
    monitor = ResourceMonitor(interval_s=0.01)
    sample = monitor.sample_once()
    assert sample.gpus == ()
    summary = monitor.summarize([(sample.t, sample.t)])
    assert summary["regime"] == "unknown" and summary["gpu_util_mean"] is None
    assert monitor.gpu_info() == {
        "available": False,
        "reason": "NVML unavailable: no driver",
        "count": 0,
        "names": [],
    }
    with monitor:
        pass  # the thread starts and stops cleanly
