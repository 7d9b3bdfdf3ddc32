"""Gateway + supervised workers on CPU: routing, kill -9 under load, restart, ordered shutdown, MPS."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rewardplane.deploy.config import DeviceProbe, parse_deploy_config
from rewardplane.deploy.gateway import GatewayBackend
from rewardplane.serve.protocol import ItemError, ServeError
from support.deploy_fakes import CPU, FAST, install_fake_control, items, pid_alive


def deploy_doc(mode="shared", gpus=(), slow_delay=0.4, **extra):
    return {
        "mode": mode,
        "gpus": list(gpus),
        "imports": ["support.deploy_fakes"],
        "scorers": [
            {
                "name": "slow",
                "kind": "rk_test_sleep",
                "max_batch_size": 4,
                "options": {"delay_s": slow_delay},
            },
            {"name": "fast", "kind": "rk_test_sleep", "max_batch_size": 8},
        ],
        **extra,
    }


async def _until(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def test_kill_minus_9_under_load_loses_items_not_scores_and_restarts():
    # a 2 s batch: the kill lands while the first request's batch runs, however late this loop
    # wakes on a loaded machine (with 0.4 s, a late wake-up found that request answered)
    gw = GatewayBackend(parse_deploy_config(deploy_doc(slow_delay=2.0), CPU), settings=FAST)

    async def go():
        await gw.start()
        try:
            assert gw.ready()[0]
            info = gw.deployment()
            assert info["mode"] == "shared" and info["shared_fault_domain"] is True
            by_name = {w["name"]: w for w in info["workers"]}
            assert set(by_name) == {"slow", "fast"} and all(w["state"] == "ready" for w in by_name.values())
            slow_pid, fast_pid = by_name["slow"]["pid"], by_name["fast"]["pid"]
            assert slow_pid != fast_pid
            assert await gw.score("fast", items(3, image=b"\x00\x01")) == [3.0, 4.0, 5.0]

            in_flight = [asyncio.ensure_future(gw.score("slow", items(4, f"s{r}-"))) for r in range(6)]
            await _until(lambda: gw.queue_depths()["slow"] == 24)  # all sent to the worker
            os.kill(slow_pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while gw.ready()[0]:  # the kill is seen (connection EOF) before the loop below may end
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)

            fast_results = []
            while not gw.ready()[0] or not fast_results:  # keep the other scorer busy through the restart
                fast_results.append(await gw.score("fast", items(8, "f")))
                await asyncio.sleep(0.02)
            lost = await asyncio.gather(*in_flight)
            assert all(isinstance(r, ItemError) and r.code == "worker_lost" for rs in lost for r in rs)
            assert all(rs == [float(k + 1) for k in range(8)] for rs in fast_results)

            info = gw.deployment()
            slow = next(w for w in info["workers"] if w["name"] == "slow")
            assert slow["restarts"] == 1 and slow["pid"] != slow_pid and slow["last_exit_code"] == -9
            assert info["restarts"] == 1
            assert next(w for w in info["workers"] if w["name"] == "fast")["pid"] == fast_pid
            assert await gw.score("slow", items(2)) == [1.0, 2.0]
        finally:
            await gw.stop()
        return slow["pid"], fast_pid

    pids = asyncio.run(go())
    assert not any(pid_alive(p) for p in pids)
    assert not os.path.exists(gw.run_dir)


def test_not_ready_while_restarting_and_during_shutdown():
    gw = GatewayBackend(parse_deploy_config(deploy_doc(slow_delay=0.0), CPU), settings=FAST)

    async def go():
        await gw.start()
        try:
            w = gw.supervisor.worker_for("slow")
            gw.settings.backoff_base_s = 2.0  # keep it down long enough to observe
            os.kill(w.pid, signal.SIGKILL)
            await _until(lambda: not gw.ready()[0])
            assert "slow" not in gw.scorer_infos() and "fast" in gw.scorer_infos()
            with pytest.raises(ServeError) as err:
                await gw.score("slow", items(1))
            assert err.value.code == "not_ready"
            with pytest.raises(ServeError, match="unknown scorer"):
                await gw.score("nope", items(1))
        finally:
            await gw.stop()
        with pytest.raises(ServeError, match="shutting down"):
            await gw.score("fast", items(1))

    asyncio.run(go())


def test_drain_lets_in_flight_requests_finish_before_workers_stop():
    gw = GatewayBackend(
        parse_deploy_config(deploy_doc(mode="consolidated", slow_delay=0.5), CPU), settings=FAST
    )

    async def go():
        await gw.start()
        (w,) = gw.deployment()["workers"]
        assert w["scorers"] == ["slow", "fast"]
        pending = asyncio.ensure_future(gw.score("slow", items(2)))
        await asyncio.sleep(0.1)
        await gw.stop()
        return await pending

    assert asyncio.run(go()) == [1.0, 2.0]


def test_metrics_queue_depth_counts_items_at_the_worker_until_answered():
    from prometheus_client import generate_latest

    from rewardplane.serve.metrics import ServeMetrics

    gw = GatewayBackend(parse_deploy_config(deploy_doc(slow_delay=1.0), CPU), settings=FAST)
    metrics = ServeMetrics()
    gw.attach_metrics(metrics)

    def depth(scorer):
        return metrics.registry.get_sample_value("rewardplane_queue_depth", {"scorer": scorer})

    async def go():
        await gw.start()
        try:
            assert depth("slow") == depth("fast") == 0
            pending = [asyncio.ensure_future(gw.score("slow", items(4, f"r{r}-"))) for r in range(3)]
            # one turn of the loop: each request counts its items before its first await, and
            # no 1 s batch can have ended yet (a 0.1 s sleep could wake after one on a loaded machine)
            await asyncio.sleep(0)
            assert depth("slow") == 12 and depth("fast") == 0
            assert 'rewardplane_queue_depth{scorer="slow"} 12.0' in generate_latest(metrics.registry).decode()
            results = await asyncio.gather(*pending)
            assert all(isinstance(v, float) for r in results for v in r)
            assert depth("slow") == 0
        finally:
            await gw.stop()

    asyncio.run(go())


def test_worker_that_cannot_load_is_failed_not_restarted():
    doc = deploy_doc()
    doc["scorers"][0]["options"]["fail_load"] = True
    gw = GatewayBackend(parse_deploy_config(doc, CPU), settings=FAST)

    async def go():
        await gw.start()
        try:
            ok, details = gw.ready()
            assert not ok and details["slow"] == "worker slow failed" and details["fast"] == "ready"
            assert gw.supervisor.worker_for("slow").restarts == 0
        finally:
            await gw.stop()

    asyncio.run(go())


@pytest.fixture
def fake_mps(tmp_path, monkeypatch):
    commands = install_fake_control(tmp_path, monkeypatch)
    return lambda: [c["cmd"] for c in commands()]


def test_mps_mode_sets_worker_env_and_quits_after_workers_stop(fake_mps):
    doc = deploy_doc(mode="mps", gpus=[0], slow_delay=0.0)
    doc["scorers"][0].update(mps_active_thread_percentage=30, mps_pinned_mem_limit="2G")
    probe = DeviceProbe(cuda_available=True, gpu_count=1, control_binary="nvidia-cuda-mps-control")
    gw = GatewayBackend(parse_deploy_config(doc, probe), settings=FAST, mps_client_timeout_s=1.0)

    async def go():
        await gw.start()
        try:
            env = gw.scorer_infos()["slow"].extra["env"]
            pipe = gw.mps.pipe_dir
            assert env["CUDA_MPS_PIPE_DIRECTORY"] == pipe and env["CUDA_VISIBLE_DEVICES"] == "0"
            assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
            assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2G"
            assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in gw.scorer_infos()["fast"].extra["env"]
            info = gw.deployment()
            assert info["mps"]["managed"] and info["mps"]["pipe_dir"] == pipe
            pids = [w["pid"] for w in info["workers"]]
        finally:
            await gw.stop()
        return pipe, pids

    pipe, pids = asyncio.run(go())
    assert not any(pid_alive(p) for p in pids)
    assert fake_mps()[0] == "-d" and fake_mps()[-1] == "quit"
    assert not os.path.exists(pipe)


def test_killing_the_supervisor_takes_workers_and_mps_down(fake_mps, tmp_path):
    script = textwrap.dedent(
        """
        import asyncio, json, sys
        from rewardplane.deploy.config import DeviceProbe, parse_deploy_config
        from rewardplane.deploy.gateway import GatewayBackend
        doc = json.loads(sys.argv[1])
        probe = DeviceProbe(cuda_available=True, gpu_count=1, control_binary="nvidia-cuda-mps-control")
        gw = GatewayBackend(parse_deploy_config(doc, probe), mps_client_timeout_s=1.0)
        async def main():
            await gw.start()
            print(json.dumps({"pipe": gw.mps.pipe_dir, "log": gw.mps.log_dir, "run": gw.run_dir,
                              "pids": [w["pid"] for w in gw.deployment()["workers"]]}), flush=True)
            await asyncio.sleep(300)
        asyncio.run(main())
        """
    )
    doc = deploy_doc(mode="mps", gpus=[0], slow_delay=0.0)
    sup = subprocess.Popen(
        [sys.executable, "-c", script, json.dumps(doc)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    state = json.loads(sup.stdout.readline())
    assert all(pid_alive(p) for p in state["pids"])
    sup.send_signal(signal.SIGKILL)
    sup.wait()
    deadline = time.monotonic() + 120
    # the watchdog removes the pipe and run dirs, then the log dir: wait for all three
    while any(os.path.exists(state[d]) for d in ("pipe", "run", "log")) or any(
        pid_alive(p) for p in state["pids"]
    ):
        assert time.monotonic() < deadline, "watchdog did not clean up"
        time.sleep(0.1)
    assert not Path(state["log"]).exists()
    assert fake_mps()[-1] == "quit"


@pytest.mark.gpu
def test_mps_mode_on_a_real_gpu():
    """H200 check: two tiny CLIP workers as MPS clients; kill one; everything cleaned up at the end."""
    import shutil

    if shutil.which("nvidia-cuda-mps-control") is None:
        pytest.skip("nvidia-cuda-mps-control not on PATH")
    clip = {
        "kind": "clip",
        "shape": "tiny-clip",
        "dtype": "fp32",
        "device": "cuda",
        "mps_active_thread_percentage": 50,
    }
    doc = {"mode": "mps", "gpus": [0], "scorers": [{"name": "c1", **clip}, {"name": "c2", **clip}]}
    gw = GatewayBackend(parse_deploy_config(doc), settings=FAST)

    async def go():
        import io

        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (64, 64), (200, 30, 30)).save(buf, format="PNG")
        batch = items(4, image=buf.getvalue())
        await gw.start()
        try:
            assert gw.ready()[0], gw.ready()
            info = gw.deployment()
            assert info["mps"]["server_pids"], info
            assert all(isinstance(v, float) for v in await gw.score("c1", batch))
            pid = gw.supervisor.worker_for("c1").pid
            os.kill(pid, signal.SIGKILL)
            await _until(lambda: not gw.ready()[0])
            assert all(isinstance(v, float) for v in await gw.score("c2", batch))
            await _until(lambda: gw.ready()[0], timeout=120)
            assert all(isinstance(v, float) for v in await gw.score("c1", batch))
            return info["mps"]["pipe_dir"]
        finally:
            await gw.stop()

    pipe = asyncio.run(go())
    assert not os.path.exists(pipe)
