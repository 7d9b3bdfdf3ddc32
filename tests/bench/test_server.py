"""bench/server.py against real subprocesses: the fake server, a crashing one, a never-ready one."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
import yaml

from rewardplane.bench.server import ServerStartError, log_tail, running_server, serve_command

ROOT = Path(__file__).resolve().parents[2]
FAKE = [sys.executable, str(ROOT / "tests" / "support" / "bench_fake_server.py"), "--deploy", "{deploy}",
        "--port", "{port}"]  # fmt: skip


def write_deploy(tmp_path, mode="shared"):
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump({"mode": mode, "scorers": [{"name": "a"}]}))
    return path


def test_serves_until_the_block_ends_then_stops(tmp_path):
    deploy = write_deploy(tmp_path)
    with running_server([], tmp_path / "w", command=FAKE, fields={"deploy": str(deploy)},
                        ready_timeout_s=300, label="fake") as url:  # fmt: skip
        assert httpx.get(url + "/v1/scorers").json()["scorers"][0]["name"] == "a"
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/health/ready", timeout=2.0)
    assert (tmp_path / "w" / "server.log").is_file()


def test_a_server_that_exits_is_one_line_with_its_log_tail(tmp_path):
    deploy = write_deploy(tmp_path, mode="consolidated")
    env = {"BENCH_FAKE": json.dumps({"fail_modes": ["consolidated"]})}
    server = running_server(
        [], tmp_path, command=FAKE, fields={"deploy": str(deploy)}, env=env, label="c/fp16"
    )
    with pytest.raises(ServerStartError) as err, server:
        pass
    assert err.value.code == "server_start" and "\n" not in err.value.message
    assert err.value.message.startswith(
        "c/fp16: server exited with code 3 before ready; log tail: fake server"
    )


def test_a_server_that_never_gets_ready_hits_the_deadline(tmp_path):
    command = [sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(60)"]
    started = time.monotonic()
    server = running_server([], tmp_path, command=command, ready_timeout_s=1.0, stop_timeout_s=5, label="x")
    with pytest.raises(ServerStartError, match=r"x: not ready after 1 s; log tail: loading"), server:
        pass
    assert time.monotonic() - started < 20


def test_default_command_and_log_tail(tmp_path):
    assert serve_command(["--config", "s.yaml"]) == [
        "{python}", "-m", "rewardplane", "serve", "--config", "s.yaml", "--port", "{port}"
    ]  # fmt: skip
    (tmp_path / "log").write_text("a\n\nb\nc\n")
    assert log_tail(tmp_path / "log", lines=2) == "b | c" and log_tail(tmp_path / "none") == "(no log)"


def test_a_server_is_terminated_when_its_parent_is_killed(tmp_path):
    """SIGKILL of the caller (e.g. a device time limit) still SIGTERMs the server it started, so the
    gateway can stop its workers and quit its MPS daemon. The server here never becomes ready."""
    pid_file, term_file = tmp_path / "server.pid", tmp_path / "server.term"
    server = textwrap.dedent(
        f"""
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: (open({str(term_file)!r}, "w").write("term"), sys.exit(0)))
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        time.sleep(60)
        """
    )
    parent = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from rewardplane.bench.server import running_server
        with running_server([], Path({str(tmp_path / "work")!r}), command=[sys.executable, "-c", {server!r}]):
            pass
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", parent], env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    )
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline and proc.poll() is None, "server did not start"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    while not term_file.exists():
        assert time.monotonic() < deadline, "the server outlived its parent without a SIGTERM"
        time.sleep(0.05)


@pytest.mark.slow
def test_the_default_command_runs_the_real_rewardplane_serve(tmp_path):
    config = tmp_path / "service.yaml"
    config.write_text(yaml.safe_dump({"scorers": [{"name": "len", "kind": "length"}]}))
    with running_server(
        ["--config", str(config), "--log-level", "warning"], tmp_path, ready_timeout_s=300
    ) as url:
        body = {"scorers": ["len"], "items": [{"id": "x", "prompt": "p", "response": "abc"}]}
        assert httpx.post(url + "/v1/score", json=body).json()["results"][0]["scores"] == {"len": 3.0}
