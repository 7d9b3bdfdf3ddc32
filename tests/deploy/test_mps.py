"""Managed MPS lifecycle against a fake control binary that records its commands."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rewardplane.deploy.mps import ManagedMps, MpsError
from support.deploy_fakes import install_fake_control, pid_alive


@pytest.fixture
def fake_mps(tmp_path, monkeypatch):
    return install_fake_control(tmp_path, monkeypatch)


def _wait(cond, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_managed_daemon_start_and_ordered_shutdown(fake_mps):
    mps = ManagedMps(client_timeout=2.0)
    mps.start()
    try:
        pipe, logd = mps.pipe_dir, mps.log_dir
        for d in (pipe, logd):
            assert os.path.isabs(d) and len(d) < 40
            assert os.stat(d).st_mode & 0o777 == 0o700
        assert mps.env() == {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": logd}
        cmds = fake_mps()
        assert [c["cmd"] for c in cmds] == ["-d", "get_server_list"]
        assert cmds[0]["pipe"] == pipe and cmds[0]["log"] == logd
        with open(os.path.join(pipe, "servers"), "w") as f:
            f.write("4242\n")
        assert mps.server_pids() == [4242]
        daemon = int(Path(pipe, "nvidia-cuda-mps-control.pid").read_text())
    finally:
        mps.shutdown()
    tail = [c["cmd"] for c in fake_mps()][-3:]
    assert tail == ["get_server_list", "get_client_list 4242", "quit"]
    assert not os.path.exists(pipe) and not os.path.exists(logd)
    assert _wait(lambda: not pid_alive(daemon))


def test_shutdown_waits_for_clients_but_is_bounded(fake_mps):
    mps = ManagedMps(client_timeout=0.6)
    mps.start()
    for name, text in (("servers", "77"), ("clients", "1234")):
        with open(os.path.join(mps.pipe_dir, name), "w") as f:
            f.write(text)
    t0 = time.monotonic()
    mps.shutdown()
    assert time.monotonic() - t0 >= 0.6
    cmds = [c["cmd"] for c in fake_mps()]
    assert cmds[-1] == "quit" and "get_client_list 77" in cmds


def test_watchdog_cleans_up_when_the_supervisor_is_killed(fake_mps, tmp_path):
    script = textwrap.dedent(
        """
        import sys, time
        from rewardplane.deploy.mps import ManagedMps
        m = ManagedMps(client_timeout=0.5)
        m.start()
        print(m.pipe_dir, m.log_dir, flush=True)
        time.sleep(300)
        """
    )
    sup = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    pipe, logd = sup.stdout.readline().split()
    daemon = int(Path(pipe, "nvidia-cuda-mps-control.pid").read_text())
    assert pid_alive(daemon)
    sup.send_signal(signal.SIGKILL)
    sup.wait()
    assert _wait(lambda: not os.path.exists(pipe) and not os.path.exists(logd))
    assert [c["cmd"] for c in fake_mps()][-1] == "quit"
    assert _wait(lambda: not pid_alive(daemon))


def test_external_daemon_is_verified_and_never_quit(fake_mps, tmp_path):
    pipe = tempfile_dir = str(tmp_path / "ext")
    os.makedirs(tempfile_dir, mode=0o700)
    with pytest.raises(MpsError, match="Cannot find MPS control daemon"):
        ManagedMps(pipe_dir=pipe, external=True).start()
    Path(pipe, "nvidia-cuda-mps-control.pid").write_text(str(os.getpid()))
    ext = ManagedMps(pipe_dir=pipe, external=True)
    ext.start()
    ext.shutdown()
    assert [c["cmd"] for c in fake_mps()] == ["get_server_list", "get_server_list"]
    assert os.path.isdir(pipe)


def test_refuses_a_pipe_dir_others_can_read(fake_mps, tmp_path):
    d = tmp_path / "open"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    with pytest.raises(MpsError, match="0700"):
        ManagedMps(pipe_dir=str(d)).start()


@pytest.mark.gpu
def test_real_mps_daemon_lifecycle_on_gpu():
    """On a CUDA host with the driver's control binary: a real client attaches, then everything goes."""
    import shutil

    if shutil.which("nvidia-cuda-mps-control") is None:
        pytest.skip("nvidia-cuda-mps-control not on PATH")
    from rewardplane.deploy.mps import client_pids, server_pids

    mps = ManagedMps(client_timeout=20.0)
    mps.start()
    pipe, logd = mps.pipe_dir, mps.log_dir
    try:
        env = {**os.environ, **mps.env(), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
        client = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import torch,sys; x=torch.ones(1,device='cuda'); print(x.item(),flush=True);"
                " sys.stdin.read()",
            ],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert client.stdout.readline().strip() == "1.0"
        servers = server_pids(mps.binary, pipe)
        assert len(servers) == 1
        assert client.pid in client_pids(mps.binary, pipe)[servers[0]]
        client.stdin.close()
        client.wait(timeout=30)
    finally:
        mps.shutdown()
    assert not os.path.exists(pipe) and not os.path.exists(logd)
    assert _wait(lambda: not pid_alive(servers[0]))
