"""Start a `rewardplane serve` process for a benchmark, wait until it is ready, stop it: once, here.

Qualify (one server per deployment), the demo and the benchmark scripts all need the same
lifecycle, and each subtle part of it has bitten once when it was written separately:

- the server runs in its own session, so a stuck deployment's workers can be killed as one
  process group without touching the caller's;
- on Linux it also gets SIGTERM when the caller dies, even by SIGKILL (a device time limit):
  its own session hides it from the caller's group, so nothing else would tell it, and its
  gateway must still drain, stop its workers and quit any MPS daemon it started;
- readiness is `GET /health/ready` == 200 under a deadline; a server that exits or never gets
  ready is a `ServerStartError` whose ONE-line message carries the tail of its log;
- stopping is SIGTERM (the gateway shuts down in order), then SIGKILL of the whole process
  group after `stop_timeout_s`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx

from rewardplane.core.errors import RewardplaneError
from rewardplane.serve.protocol import READY_ROUTE

log = logging.getLogger(__name__)

PYTHON_FIELD, PORT_FIELD = "{python}", "{port}"


class ServerStartError(RewardplaneError):
    """The server exited before it was ready, or was not ready by the deadline."""

    code = "server_start"


def free_port() -> int:
    """A loopback port that was free a moment ago (the server binds it next)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_command(serve_args: Sequence[str]) -> list[str]:
    """The default command template: `python -m rewardplane serve ARGS --port {port}`."""
    return [PYTHON_FIELD, "-m", "rewardplane", "serve", *serve_args, "--port", PORT_FIELD]


def log_tail(path: Path, lines: int = 15) -> str:
    """The last `lines` non-empty lines of a log, joined with " | " so an error stays one line."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    tail = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(tail) or "(empty log)"


def _terminate_with_parent() -> None:
    """Runs in the child before exec (Linux): SIGTERM it when the parent dies, however it dies."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)


def _ready(url: str, path: str = READY_ROUTE) -> bool:
    try:
        return httpx.get(url + path, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _wait_ready(
    proc: subprocess.Popen[bytes], url: str, log_path: Path, label: str, timeout_s: float, path: str
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise ServerStartError(
                f"{label}: server exited with code {proc.returncode} before ready; log tail: {log_tail(log_path)}"
            )
        if _ready(url, path):
            return
        if time.monotonic() > deadline:
            raise ServerStartError(
                f"{label}: not ready after {timeout_s:.0f} s; log tail: {log_tail(log_path)}"
            )
        time.sleep(0.25)


def _stop(proc: subprocess.Popen[bytes], label: str, timeout_s: float) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        log.warning("%s: no exit %.0f s after SIGTERM; killing its process group", label, timeout_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def running_server(
    serve_args: Sequence[str],
    workdir: Path,
    *,
    command: Sequence[str] | None = None,
    fields: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 300.0,
    stop_timeout_s: float = 30.0,
    label: str = "server",
    log_name: str = "server.log",
    ready_path: str = READY_ROUTE,
) -> Iterator[str]:
    """Start the server, yield its base URL once `/health/ready` says 200, stop it on exit.

    `command` is a template (default: `serve_command(serve_args)`); every part is formatted
    with `{python}` (this interpreter), `{port}` (a free loopback port) and `fields` (e.g.
    qualify's `{deploy}`). `env` is added to this process's environment. The server's stdout
    and stderr go to `workdir/log_name`. Callers that need the start-up time measure the
    `with` entry themselves. `ready_path` is the route that answers 200 once ready (another
    server, such as an inference engine benchmarked next to ours: its own health route).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    values = {"python": sys.executable, "port": str(port), **(fields or {})}
    template = list(command) if command else serve_command(serve_args)
    argv = [str(part).format(**values) for part in template]
    full_env = {**os.environ, **{k: str(v) for k, v in (env or {}).items()}}
    log_path = workdir / log_name
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            argv,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            start_new_session=True,
            preexec_fn=_terminate_with_parent,
        )
    try:
        _wait_ready(proc, url, log_path, label, ready_timeout_s, ready_path)
        yield url
    finally:
        _stop(proc, label, stop_timeout_s)
