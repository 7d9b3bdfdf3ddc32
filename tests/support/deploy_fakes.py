"""Test doubles for the deploy tests: a fake `nvidia-cuda-mps-control` and cheap scorers.

The fake control binary records every invocation (argv, stdin command, pipe/log directory)
as a JSON line in `$RK_FAKE_MPS_LOG`, so tests can check the exact command sequence. `-d`
starts a stand-in daemon process (`sleep`) and writes its pid file like the real one;
`quit` kills it. `get_server_list` / `get_client_list` print the files `servers` / `clients`
in the pipe directory, which a test writes to simulate servers and attached clients.

The scorers are registered when a worker imports this module (deploy.yaml `imports:`).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rewardplane.deploy.config import DeviceProbe
from rewardplane.deploy.supervisor import SupervisorSettings
from rewardplane.serve.protocol import ScoreItem, ScorerInfo
from rewardplane.serve.scorers.base import Scorer
from rewardplane.serve.scorers.options import ScorerOptions
from rewardplane.serve.scorers.registry import register_scorer

FAKE_CONTROL = r"""#!{python}
import json, os, subprocess, sys
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
cmd = " ".join(sys.argv[1:]) if len(sys.argv) > 1 else sys.stdin.read().strip()
with open(os.environ["RK_FAKE_MPS_LOG"], "a") as f:
    f.write(json.dumps({{"cmd": cmd, "pipe": pipe, "log": os.environ.get("CUDA_MPS_LOG_DIRECTORY")}}) + "\n")
pidfile = os.path.join(pipe, "nvidia-cuda-mps-control.pid")
if cmd == "-d":
    p = subprocess.Popen(["sleep", "300"], start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    open(pidfile, "w").write(str(p.pid))
    sys.exit(0)
if not os.path.exists(pidfile):
    print("Cannot find MPS control daemon process", file=sys.stderr)
    sys.exit(1)
if cmd == "quit":
    os.kill(int(open(pidfile).read()), 9)
    os.unlink(pidfile)
elif cmd == "get_server_list" or cmd.startswith("get_client_list"):
    name = "servers" if cmd == "get_server_list" else "clients"
    path = os.path.join(pipe, name)
    if os.path.exists(path):
        print(open(path).read().strip())
"""


def install_fake_control(tmp_path: Path, monkeypatch: Any) -> Callable[[], list[dict[str, Any]]]:
    """Put the fake control binary first on PATH; return a reader of its recorded commands."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "nvidia-cuda-mps-control"
    path.write_text(FAKE_CONTROL.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "mps.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("RK_FAKE_MPS_LOG", str(log))

    def commands() -> list[dict[str, Any]]:
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return commands


def pid_alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (killed, not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


class SleepOptions(ScorerOptions):
    delay_s: float = 0.0
    """Seconds every batch sleeps."""
    fail_load: bool = False
    """`load()` raises."""


class SleepScorer(Scorer):
    """Scores len(response) (+ image bytes); sleeps `options.delay_s` per batch so items stay in
    flight long enough to be hit by a kill; `options.fail_load` makes `load()` raise."""

    kind = "rk_test_sleep"
    modality = "rule"
    Options = SleepOptions

    def __init__(self, name: str, *args: Any, **kw: Any) -> None:
        super().__init__(name, *args, **kw)
        self.delay_s = self.options.delay_s
        self.fail_load = self.options.fail_load

    def load(self) -> None:
        if self.fail_load:
            raise FileNotFoundError("weights not found (test double)")

    def score_batch(self, items):
        if self.delay_s:
            time.sleep(self.delay_s)
        return [float(len(str(i.response))) + (len(i.image) if i.image else 0) for i in items]

    def info(self) -> ScorerInfo:
        return ScorerInfo(
            name=self.name,
            kind=self.kind,
            modality=self.modality,
            dtype="fp32",
            device="cpu",
            version="1",
            identity=f"sleep-{self.delay_s}",
            max_batch_size=self.max_batch_size,
            max_wait_ms=self.max_wait_ms,
            extra={
                "pid": os.getpid(),
                "env": {k: v for k, v in os.environ.items() if k.startswith("CUDA_")},
            },
        )


register_scorer(SleepScorer.kind, SleepScorer)


CPU = DeviceProbe(cuda_available=False, gpu_count=0, control_binary=None)
FAST = SupervisorSettings(health_interval_s=0.2, backoff_base_s=0.2, stop_timeout_s=5.0)


def items(n, prefix="i", image=None):
    return [ScoreItem(id=f"{prefix}{k}", prompt="p", response="x" * (k + 1), image=image) for k in range(n)]
