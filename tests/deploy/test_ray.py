"""`--backend ray` on a local CPU Ray instance: scoring, @serve.batch, replica death → worker_lost."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

pytest.importorskip("ray.serve")

from rewardplane.deploy.config import DeviceProbe, parse_deploy_config
from rewardplane.deploy.ray_backend import RayBackend
from rewardplane.serve.metrics import ServeMetrics
from rewardplane.serve.protocol import ItemError, ScoreItem
from rewardplane.serve.timing import RequestTiming, current_timing

CPU = DeviceProbe(cuda_available=False, gpu_count=0, control_binary=None)


SLOW_S = 3.0
"""The slow scorer's batch: the window in which the replica is killed with every request in it."""


def test_ray_backend_scores_batches_and_reports_lost_replicas(ray_env):
    doc = {
        "mode": "shared",
        "imports": ["support.deploy_fakes"],
        "ray": {"temp_dir": ray_env, "num_cpus": 0.25, "log_to_driver": False},
        "scorers": [
            {"name": "slow", "kind": "rk_test_sleep", "max_batch_size": 4, "options": {"delay_s": SLOW_S}},
            {"name": "len", "kind": "length", "num_replicas": 2},
        ],
    }
    import ray

    backend = RayBackend(parse_deploy_config(doc, CPU), health_poll_s=0.2)  # starts and owns local Ray

    async def go():
        await backend.start()
        try:
            assert backend.ready()[0], backend.ready()
            assert set(backend.scorer_infos()) == {"slow", "len"}
            items = [ScoreItem(id=str(k), prompt="p", response="x" * k) for k in range(1, 4)]
            metrics = ServeMetrics()
            backend.attach_metrics(metrics)
            timing = RequestTiming()
            current_timing.set(timing)
            assert await backend.score("slow", items) == [1.0, 2.0, 3.0]
            # the replica's timing and batch reach the headers and /metrics, as from a worker
            assert SLOW_S <= timing.inference_s < 60 and 0 <= timing.queue_s < 60, timing
            batched = metrics.registry.get_sample_value("rewardplane_batch_size_count", {"scorer": "slow"})
            items_seen = metrics.registry.get_sample_value("rewardplane_batch_size_sum", {"scorer": "slow"})
            assert batched >= 1 and items_seen == 3
            current_timing.set(None)
            dep = backend.deployment()
            assert dep["backend"] == "ray" and [s["num_replicas"] for s in dep["scorers"]] == [1, 2]
            (pid,) = dep["scorers"][0]["replica_pids_seen"]

            pending = [asyncio.ensure_future(backend.score("slow", items)) for _ in range(3)]
            # killed once the replica holds all three (its own in_flight), inside the first
            # batch's SLOW_S: a fixed 0.3 s could come before they arrived or, late, after the
            # first request was answered
            deadline = time.monotonic() + 60
            while (await backend.lifecycle.state(timeout_s=30))["scorers"]["slow"]["in_flight"] < 3:
                assert time.monotonic() < deadline, "the requests never reached the replica"
                await asyncio.sleep(0.05)
            os.kill(pid, signal.SIGKILL)
            lost = await asyncio.gather(*pending)
            assert all(isinstance(r, ItemError) and r.code == "worker_lost" for rs in lost for r in rs)
            assert all(isinstance(r, float) for r in await backend.score("len", items))

            deadline = time.monotonic() + 300  # a ceiling: the replacement's start is the machine's speed
            while True:
                await asyncio.sleep(0.3)
                if backend.ready()[0]:
                    try:
                        if await backend.score("slow", items[:1]) == [1.0]:
                            break
                    except Exception:
                        pass
                assert time.monotonic() < deadline, backend.ready()
            assert backend.deployment()["restarts"] == 1
        finally:
            await backend.stop()
        assert not ray.is_initialized()

    try:
        asyncio.run(go())
    finally:
        ray.shutdown()


def test_ray_actor_options_inject_mps_env_and_fractional_gpus():
    probe = DeviceProbe(cuda_available=True, gpu_count=1, control_binary="/usr/bin/nvidia-cuda-mps-control")
    doc = {
        "mode": "mps_external",
        "gpus": [0],
        "mps": {"pipe_dir": "/tmp/rk-mps"},
        "scorers": [
            {"name": "a", "kind": "length", "num_gpus": 0.25, "mps_active_thread_percentage": 25},
            {"name": "b", "kind": "length", "mps_pinned_mem_limit": "4G"},
        ],
    }
    backend = RayBackend(parse_deploy_config(doc, probe))
    a, b = (backend._actor_options(p) for p in backend.config.scorers)
    assert a["num_gpus"] == 0.25 and b["num_gpus"] == 1.0
    assert a["runtime_env"]["env_vars"] == {
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/rk-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
    }
    assert b["runtime_env"]["env_vars"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4G"
    assert "CUDA_VISIBLE_DEVICES" not in a["runtime_env"]["env_vars"]  # Ray assigns GPUs itself
