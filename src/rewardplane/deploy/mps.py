"""Managed CUDA MPS: a private control daemon for one deployment, and a watchdog that cleans up.

Why private: the default MPS pipe directory (/tmp/nvidia-mps) is shared by every user of the
host, so starting or quitting "the" daemon would interfere with other jobs. We create our
own 0700 pipe and log directories on a short absolute path (MPS puts Unix sockets inside the
pipe directory, and sun_path is 108 bytes), start `nvidia-cuda-mps-control -d` pointed at
them, and check that it answers `get_server_list` before any worker starts.

Shutdown order matters: the daemon must outlive its clients. The supervisor stops the
workers, waits (bounded) until every server's `get_client_list` is empty, sends `quit`, and
only then removes the directories. If the supervisor is killed instead, a watchdog process
in its own session (setsid) sees its stdin pipe close and does the same cleanup, so a
crashed gateway never leaves a daemon behind. `mps_external` only borrows an existing
daemon's pipe directory and never quits it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from rewardplane.core.errors import RewardplaneError
from rewardplane.deploy.config import CONTROL_BINARY

log = logging.getLogger(__name__)


class MpsError(RewardplaneError):
    code = "mps"


def control(
    binary: str, command: str, pipe_dir: str, log_dir: str | None = None, timeout: float = 10.0
) -> str:
    """Send one command to the control daemon on stdin (the documented interface); return stdout."""
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": pipe_dir}
    if log_dir:
        env["CUDA_MPS_LOG_DIRECTORY"] = log_dir
    try:
        proc = subprocess.run(
            [binary], input=command + "\n", env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        raise MpsError(f"{binary}: {command!r} timed out after {timeout}s") from exc
    if proc.returncode != 0:
        raise MpsError(
            f"{binary}: {command!r} failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}"
        )
    return proc.stdout


def _pids(text: str) -> list[int]:
    return [int(tok) for tok in text.split() if tok.isdigit()]


def server_pids(binary: str, pipe_dir: str) -> list[int]:
    return _pids(control(binary, "get_server_list", pipe_dir))


def client_pids(binary: str, pipe_dir: str) -> dict[int, list[int]]:
    return {
        s: _pids(control(binary, f"get_client_list {s}", pipe_dir)) for s in server_pids(binary, pipe_dir)
    }


def wait_clients_gone(binary: str, pipe_dir: str, timeout: float) -> bool:
    """Poll `get_client_list` until no server has clients; False if the bound ran out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if not any(client_pids(binary, pipe_dir).values()):
                return True
        except MpsError as exc:
            log.warning("MPS client query failed: %s", exc)
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def quit_and_clean(binary: str, pipe_dir: str, log_dir: str, client_timeout: float) -> None:
    """The ordered end of a managed daemon: clients gone (bounded) → quit → remove directories."""
    if not wait_clients_gone(binary, pipe_dir, client_timeout):
        log.warning("MPS clients still attached after %.0fs; quitting the daemon anyway", client_timeout)
    pid = _daemon_pid(pipe_dir)
    try:
        control(binary, "quit", pipe_dir, log_dir)
    except MpsError as exc:
        log.warning("MPS quit failed: %s", exc)
    if pid is not None:
        deadline = time.monotonic() + client_timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    shutil.rmtree(pipe_dir, ignore_errors=True)
    shutil.rmtree(log_dir, ignore_errors=True)


def _daemon_pid(pipe_dir: str) -> int | None:
    try:
        with open(os.path.join(pipe_dir, "nvidia-cuda-mps-control.pid")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _private_dir(path: str | None, prefix: str) -> tuple[str, bool]:
    """(path, created_by_us). A given path must not exist, or be an empty 0700 dir we own."""
    if path is None:
        return tempfile.mkdtemp(prefix=prefix, dir="/tmp"), True
    if os.path.exists(path):
        st = os.stat(path)
        if not os.path.isdir(path) or st.st_uid != os.getuid() or st.st_mode & 0o077 or os.listdir(path):
            raise MpsError(f"{path} exists and is not an empty 0700 directory owned by this user")
        return path, False
    os.makedirs(path, mode=0o700)
    os.chmod(path, 0o700)
    return path, True


@dataclass
class ManagedMps:
    """A private MPS control daemon plus its watchdog. `start()` → workers → `shutdown()`."""

    pipe_dir: str | None = None
    log_dir: str | None = None
    binary: str = CONTROL_BINARY
    client_timeout: float = 15.0
    external: bool = False
    _watchdog: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _created: list[str] = field(default_factory=list, repr=False)

    def env(self) -> dict[str, str]:
        """What every MPS client (worker) needs to find this daemon."""
        env = {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir)}
        if self.log_dir:
            env["CUDA_MPS_LOG_DIRECTORY"] = self.log_dir
        return env

    def start(self) -> None:
        resolved = shutil.which(self.binary)
        if resolved is None:
            raise MpsError(f"{self.binary} not found on PATH")
        self.binary = resolved
        if self.external:
            if not self.pipe_dir:
                raise MpsError("mps_external needs the existing daemon's pipe directory")
            server_pids(self.binary, self.pipe_dir)  # raises if no daemon answers there
            log.info("using external MPS daemon at %s", self.pipe_dir)
            return
        self.pipe_dir, made_pipe = _private_dir(self.pipe_dir, "rkmps-")
        self.log_dir, made_log = _private_dir(self.log_dir, "rkmpslog-")
        self._created = [d for d, made in ((self.pipe_dir, made_pipe), (self.log_dir, made_log)) if made]
        env = {**os.environ, **self.env()}
        try:
            # A file, not a pipe, for its output: the forked daemon must not keep our pipe open.
            with tempfile.TemporaryFile() as out:
                proc = subprocess.run(
                    [self.binary, "-d"], env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=30
                )
                out.seek(0)
                message = out.read().decode(errors="replace").strip()
            if proc.returncode != 0:
                raise MpsError(f"{self.binary} -d failed ({proc.returncode}): {message}")
            server_pids(self.binary, self.pipe_dir)  # the daemon answers: it is up
        except Exception:
            self._remove_dirs()
            raise
        self._watchdog = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rewardplane.deploy.mps",
                "--binary",
                self.binary,
                "--pipe-dir",
                self.pipe_dir,
                "--log-dir",
                self.log_dir,
                "--client-timeout",
                str(self.client_timeout),
            ],
            stdin=subprocess.PIPE,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        log.info(
            "started MPS daemon (pipe %s, log %s, watchdog pid %d)",
            self.pipe_dir,
            self.log_dir,
            self._watchdog.pid,
        )

    def server_pids(self) -> list[int]:
        if not self.pipe_dir:
            return []
        try:
            return server_pids(self.binary, self.pipe_dir)
        except MpsError:
            return []

    def shutdown(self) -> None:
        """Call after the workers have stopped. External daemons are left running."""
        if self.external or self.pipe_dir is None:
            return
        quit_and_clean(self.binary, self.pipe_dir, str(self.log_dir), self.client_timeout)
        self._remove_dirs()
        if self._watchdog is not None:
            with contextlib.suppress(OSError):
                assert self._watchdog.stdin is not None
                self._watchdog.stdin.write(b"done\n")
                self._watchdog.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._watchdog.wait(timeout=5)
            self._watchdog = None

    def _remove_dirs(self) -> None:
        for d in self._created:
            shutil.rmtree(d, ignore_errors=True)


def watchdog_main(argv: list[str] | None = None) -> int:
    """Block on stdin. `done` → exit quietly; EOF without it → the supervisor died: clean up."""
    parser = argparse.ArgumentParser(prog="rewardplane.deploy.mps")
    parser.add_argument("--binary", required=True)
    parser.add_argument("--pipe-dir", required=True)
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--client-timeout", type=float, default=15.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s mps-watchdog %(levelname)s %(message)s")
    data = b""
    with contextlib.suppress(OSError):
        while chunk := sys.stdin.buffer.read(64):
            data += chunk
    if b"done" in data:
        return 0
    log.warning("supervisor gone; quitting MPS daemon at %s", args.pipe_dir)
    quit_and_clean(args.binary, args.pipe_dir, args.log_dir, args.client_timeout)
    return 0


if __name__ == "__main__":
    sys.exit(watchdog_main())
