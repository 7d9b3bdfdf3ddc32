"""A local sandbox for running untrusted Python: a resource and filesystem boundary with a result
channel the program cannot forge, but NOT a proof against kernel exploits.

This is the server side: `LocalSandbox` starts the zygote (`zygote.py`) from an explicit
environment, hands it one job at a time over a Unix socket with a fresh per-run secret, and
enforces what can only be enforced from outside: the wall-clock limit and the output cap, by
SIGKILLing the unit's process group on expiry. The package:

- `zygote.py`  — the zygote and its units (fork, setsid, cgroup, uid drop, the program's process);
- `rootfs.py`  — the namespaces and the minimal root the program's process pivots into;
- `limits.py`  — rlimits and the per-unit pids cgroup;
- `harness.py` — what runs in the program's process: the program, its answers to calls, records;
- `evaluator.py`, `plain.py` — the trusted evaluator (the tests, in the unit) and the plain data
  that crosses between it and the program;
- `channel.py` — the records' way out: program → zygote → server, framed with the run's secret.

A job is {"mode": "stdin", "code", "stdin"}, {"mode": "calls", "code", "tests"} (the tests run in
the unit, the trusted evaluator: `evaluator.py`; the program's process never receives them) or
{"mode": "inside", "code", "steps"} (the option `unsafe_run_inside`: the tests' statements run in
the program's process, forgeable). The result is how the program's process ended, the records
it sent and, for `calls`, the evaluator's verdict in `report["verdict"]` (`RunResult`).

What it does not do: seccomp filtering, cgroup memory accounting, or protection against kernel
exploits: a program with a kernel bug gets out. Use `backend: sandbox_fusion` (or another real
sandbox) when that matters.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rewardplane.serve.execution import evaluator, rootfs, zygote
from rewardplane.serve.execution.channel import MAX_RECORD_BYTES, read_report
from rewardplane.serve.execution.limits import pids_cgroup_base
from rewardplane.serve.execution.zygote import EXIT_SETUP_FAILED, kill_group

ENV_PASSED = ("LD_LIBRARY_PATH",)
"""The only variables of the server's environment the zygote gets (the interpreter may need it)."""
ZYGOTE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "PYTHONHASHSEED": "0",
    "OMP_NUM_THREADS": "1",  # preimported numeric libraries must not start thread pools before forks
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def zygote_env() -> dict[str, str]:
    """The explicit environment the zygote (and so every unit) starts from: never the server's,
    which may hold tokens and credentials that /proc/<pid>/environ would show."""
    env = dict(ZYGOTE_ENV)
    env.update({k: os.environ[k] for k in ENV_PASSED if k in os.environ})
    return env


@dataclass
class RunResult:
    """status: ok | timeout | memory_limit | output_limit | sandbox_error. With "ok": the
    program's stdout, the zygote's `report` (isolation, exit code or signal of the program's
    process, lines dropped for lacking the nonce) and the harness's `records` in order."""

    status: str
    stdout: bytes = b""
    report: dict[str, Any] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    exit_code: int | None = None
    message: str = ""
    wall_s: float = 0.0

    def program_error(self) -> str | None:
        """A stdin/stdout run: None when the program ended cleanly (ran to its end, `sys.exit(0)`,
        or exit status 0), else how it failed."""
        for rec in self.records:
            if rec.get("done") is True:
                return None if rec.get("error") is None else str(rec["error"])
        if self.report.get("signal") is not None:
            return f"signal {self.report['signal']}"
        return None if self.report.get("exit") == 0 else f"exit {self.report.get('exit')}"


class _Waiter:
    def __init__(self) -> None:
        self.started = threading.Event()
        self.exited = threading.Event()
        self.pid: int | None = None
        self.code: int | None = None
        self.failure: str | None = None
        self.ctl: socket.socket | None = None  # the zygote's control socket this run was sent on


class LocalSandbox:
    """Server-side handle of one zygote. Thread-safe: `run()` may be called from many threads.
    `packages`: import names the programs may use beyond the standard library (with their
    dependencies; an unknown name raises LookupError here)."""

    def __init__(
        self,
        *,
        isolation: str = "namespaces",
        timeout_s: float = 5.0,
        memory_mb: int = 1024,
        max_output_bytes: int = 1 << 20,
        max_file_mb: int = 16,
        max_open_files: int = 64,
        max_processes: int = 64,
        tmpfs_mb: int = 64,
        prefork: int = 2,
        packages: tuple[str, ...] = (),
    ) -> None:
        if isolation not in ("namespaces", "rlimits"):
            raise ValueError("isolation must be namespaces or rlimits")
        self.timeout_s = timeout_s
        self.max_output_bytes = max_output_bytes
        root = rootfs.plan(rootfs.package_entries(list(packages)))
        self.cfg = {
            "isolation": isolation,
            "cpu_s": max(1, int(timeout_s + 0.999)),
            "memory_mb": memory_mb,
            "max_file_mb": max_file_mb,
            "max_open_files": max_open_files,
            "max_processes": max_processes,
            "tmpfs_mb": tmpfs_mb,
            "prefork": prefork,
            "preimport": list(packages),
            "root": root,
            "executable": os.path.realpath(sys.executable),
            "drop_root": os.geteuid() == 0 and _world_readable([*root["binds"], *root["packages"]]),
            "cgroup": pids_cgroup_base(),
        }
        self.packages = tuple(packages)
        self._lock = threading.Lock()
        self._waiters: dict[int, _Waiter] = {}
        self._next_id = 0
        self._ctl: socket.socket | None = None
        self._proc: Any = None
        self.restarts = -1

    @property
    def isolation(self) -> str:
        return self.cfg["isolation"]

    def process_limit(self) -> str:
        """How `max_processes` is enforced here."""
        if self.cfg["cgroup"]:
            return "cgroup pids.max"
        if os.geteuid() != 0 or self.cfg["drop_root"]:
            return "RLIMIT_NPROC (per uid)"
        return (
            "none: root ignores RLIMIT_NPROC and no pids cgroup is writable (PID namespace + wall clock only)"
        )

    def limits(self) -> dict[str, Any]:
        return {
            "timeout_s": self.timeout_s,
            "cpu_s": self.cfg["cpu_s"],
            "memory_mb": self.cfg["memory_mb"],
            "max_output_bytes": self.max_output_bytes,
            "max_file_mb": self.cfg["max_file_mb"],
            "max_open_files": self.cfg["max_open_files"],
            "max_processes": self.cfg["max_processes"],
            "tmpfs_mb": self.cfg["tmpfs_mb"],
        }

    def start(self) -> None:
        import subprocess

        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(zygote.__file__), "--zygote", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env=zygote_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
        )
        theirs.close()
        mine.send(json.dumps({"op": "config", "cfg": self.cfg}).encode())
        self._ctl = mine
        self.restarts += 1
        threading.Thread(target=self._reader, args=(mine,), daemon=True, name="sandbox-ctl").start()

    def _reader(self, ctl: socket.socket) -> None:
        while True:
            try:
                data = ctl.recv(1 << 16)
            except OSError:
                data = b""
            if not data:  # only this zygote's runs fail: a successor may already be running others
                with self._lock:
                    if self._ctl is ctl:
                        self._ctl = None
                    waiters = [w for w in self._waiters.values() if w.ctl is ctl]
                for w in waiters:
                    w.failure = w.failure or "the sandbox zygote exited"
                    w.started.set()
                    w.exited.set()
                ctl.close()
                return
            msg = json.loads(data)
            with self._lock:
                w = self._waiters.get(msg["id"])
            if w is None:
                continue
            if msg["op"] == "started":
                w.pid = msg["pid"]
                w.started.set()
            elif msg["op"] == "exit":
                w.code = msg["code"]
                w.exited.set()
            else:
                w.failure = msg.get("message", "sandbox failure")
                w.started.set()
                w.exited.set()

    def close(self) -> None:
        with self._lock:
            ctl, self._ctl = self._ctl, None
        if ctl is not None:
            with contextlib.suppress(OSError):
                ctl.shutdown(socket.SHUT_RDWR)  # wakes the reader thread; the zygote sees EOF
            ctl.close()
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except Exception:
                self._proc.kill()

    def _live_ctl(self) -> socket.socket:
        """The control socket of a zygote that is running (call with the lock held). A zygote that
        has exited is replaced here, by the run that finds it dead, not when the reader thread gets
        round to its EOF: on a loaded machine that thread may not run before many runs are tried."""
        if self._ctl is not None and self._proc.poll() is not None:
            old, self._ctl = self._ctl, None
            with contextlib.suppress(OSError):
                old.shutdown(socket.SHUT_RDWR)  # its reader fails the dead zygote's runs and closes it
        if self._ctl is None:
            self.start()
        return self._ctl

    def run(self, job: dict[str, Any], timeout_s: float | None = None) -> RunResult:
        """Run one job (the module docstring's shapes) under a fresh per-run secret. A `calls`
        job's tests go to the unit (its evaluator) on a pipe of their own; the program's process
        gets only the program."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        t0 = time.monotonic()
        secret = os.urandom(16).hex()
        job_r, job_w = os.pipe()
        out_r, out_w = os.pipe()
        res_r, res_w = os.pipe()
        payloads = {job_w: json.dumps({k: v for k, v in job.items() if k != "tests"}).encode()}
        passed = [job_r, out_w, res_w]
        if job["mode"] == "calls":
            eval_r, eval_w = os.pipe()
            payloads[eval_w] = evaluator.prepared(job["tests"])
            passed.append(eval_r)
        w = _Waiter()
        still_open = {*payloads, out_r, res_r}
        with self._lock:
            ctl = w.ctl = self._live_ctl()
            self._next_id += 1
            job_id = self._next_id
            self._waiters[job_id] = w
        try:
            try:
                msg = {"op": "run", "id": job_id, "secret": secret}
                socket.send_fds(ctl, [json.dumps(msg).encode()], passed)
            except OSError as exc:
                return RunResult("sandbox_error", message=f"cannot reach the sandbox zygote: {exc}")
            finally:
                for fd in passed:
                    os.close(fd)
            deadline = t0 + timeout_s
            status, out_buf, res_buf = self._exchange(w, payloads, out_r, res_r, deadline, still_open)
            failed, out, res, code = self._conclude(w, status, out_buf, res_buf, deadline, timeout_s)
            result = failed or self._outcome(out, res, code, secret.encode())
        finally:
            with self._lock:
                self._waiters.pop(job_id, None)
            for fd in still_open:  # never close twice: another thread may own the number by now
                os.close(fd)
        result.wall_s = time.monotonic() - t0
        return result

    def _exchange(
        self,
        w: _Waiter,
        payloads: dict[int, bytes],
        out_r: int,
        res_r: int,
        deadline: float,
        still_open: set[int],
    ) -> tuple[str | None, bytearray, bytearray]:
        """Feed the job's pipes and read the program's stdout and the zygote's report until both
        close: a status when a limit ended it early (the deadline, stdout's size, an oversized
        report), else None."""
        for fd in (*payloads, out_r, res_r):
            os.set_blocking(fd, False)
        sel = selectors.DefaultSelector()
        for fd in payloads:
            sel.register(fd, selectors.EVENT_WRITE)
        sel.register(out_r, selectors.EVENT_READ)
        sel.register(res_r, selectors.EVENT_READ)
        out, res = bytearray(), bytearray()
        open_reads = {out_r, res_r}
        sent = dict.fromkeys(payloads, 0)
        status = None
        exit_grace: float | None = None
        try:
            while open_reads:
                now = time.monotonic()
                if w.exited.is_set() and exit_grace is None:
                    exit_grace = now + 0.5  # orphans (rlimits mode) may still hold the pipes
                limit = min(deadline, exit_grace) if exit_grace else deadline
                if now >= limit:
                    if not w.exited.is_set():
                        status = "timeout"
                    break
                for key, _ in sel.select(timeout=min(limit - now, 0.05)):
                    fd = key.fd
                    if fd in payloads:
                        _feed(sel, fd, payloads[fd], sent, still_open)
                        continue
                    try:
                        chunk = os.read(fd, 1 << 16)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        sel.unregister(fd)
                        open_reads.discard(fd)
                        continue
                    buf = out if fd == out_r else res
                    buf += chunk
                    if fd == out_r and len(out) > self.max_output_bytes:
                        status = "output_limit"
                        open_reads.clear()
                        break
                    if fd == res_r and len(res) > MAX_RECORD_BYTES + (1 << 16):
                        status = "sandbox_error"
                        open_reads.clear()
                        break
        finally:
            sel.close()
        return status, out, res

    def _conclude(
        self,
        w: _Waiter,
        status: str | None,
        out: bytearray,
        res: bytearray,
        deadline: float,
        timeout_s: float,
    ) -> tuple[RunResult | None, bytes, bytes, int | None]:
        """Kill the unit's group if a limit ended the run or it outlives the deadline, then map
        the status to its error (a sandbox failure first: never a result)."""
        if status is not None or not w.exited.wait(max(0.0, deadline - time.monotonic())):
            w.started.wait(1.0)
            if w.pid is not None:
                kill_group(w.pid)
            w.exited.wait(2.0)
            status = status or "timeout"
        code = w.code
        if w.failure:
            return RunResult("sandbox_error", message=w.failure), b"", b"", code
        if status == "timeout":
            msg = f"wall-clock limit {timeout_s:g} s"
            return RunResult("timeout", bytes(out), exit_code=code, message=msg), b"", b"", code
        if status == "output_limit":
            msg = f"stdout over {self.max_output_bytes} bytes; killed"
            return RunResult("output_limit", exit_code=code, message=msg), b"", b"", code
        if status == "sandbox_error":
            return RunResult("sandbox_error", message="oversized result record"), b"", b"", code
        return None, bytes(out), bytes(res), code

    def _outcome(self, out: bytes, res: bytes, code: int | None, secret: bytes) -> RunResult:
        """What the zygote reported (only a report framed with this run's secret counts), mapped
        to a status: a limit the program hit is that limit's error, never a result."""
        parsed = read_report(res, secret)
        if parsed is None:  # the unit was killed before it passed on how its program ended
            if code == EXIT_SETUP_FAILED:
                return RunResult("sandbox_error", exit_code=code, message="sandbox setup failed")
            if code == 128 + signal.SIGKILL:  # the kernel's OOM killer
                return RunResult(
                    "memory_limit", exit_code=code, message=f"killed (memory_mb {self.cfg['memory_mb']})"
                )
            return RunResult(
                "sandbox_error",
                exit_code=code,
                message=f"the sandbox unit ended without a report (exit {code})",
            )
        report, records = parsed
        events = {r.get("event") for r in records if "event" in r}
        verdict = report.get("verdict")
        if isinstance(verdict, dict) and verdict.get("event"):
            events.add(verdict["event"])
        sig = None if report.get("killed") else report.get("signal")
        if "setup_failed" in events:
            failed = next(r for r in records if r.get("event") == "setup_failed")
            return RunResult("sandbox_error", exit_code=code, message=str(failed.get("message"))[:200])
        if sig == signal.SIGXCPU:
            return RunResult("timeout", exit_code=code, message=f"CPU-time limit {self.cfg['cpu_s']} s")
        if sig == signal.SIGXFSZ or "file_limit" in events:
            return RunResult(
                "output_limit",
                exit_code=code,
                message=f"file size limit {self.cfg['max_file_mb']} MiB or the private /tmp full",
            )
        if "memory" in events or sig == signal.SIGKILL:
            return RunResult(
                "memory_limit", exit_code=code, message=f"address-space limit {self.cfg['memory_mb']} MiB"
            )
        return RunResult("ok", out, report, records, exit_code=code)


def _feed(
    sel: selectors.BaseSelector, fd: int, payload: bytes, sent: dict[int, int], still_open: set[int]
) -> None:
    """Write the next chunk of a job pipe's payload; close the pipe once all of it is sent or its
    reader went away."""
    try:
        sent[fd] += os.write(fd, payload[sent[fd] : sent[fd] + (1 << 16)])
    except BlockingIOError:
        return
    except BrokenPipeError:
        sent[fd] = len(payload)
    if sent[fd] >= len(payload):
        sel.unregister(fd)
        still_open.discard(fd)
        os.close(fd)


def _world_readable(paths: list[str]) -> bool:
    """Dropping root to uid 65534 only works when that uid can read what the root binds."""
    for start in paths:
        path = os.path.realpath(start)
        while True:
            try:
                if os.stat(path).st_mode & 0o005 != 0o005:
                    return False
            except OSError:
                return False
            if path == "/":
                break
            path = os.path.dirname(path)
    return True


def probe(isolation: str) -> tuple[bool, str]:
    """Can this kernel give `isolation`? Runs one trivial job in a throw-away sandbox."""
    box = LocalSandbox(isolation=isolation, prefork=1, timeout_s=10)
    try:
        box.start()
        r = box.run({"mode": "stdin", "code": "print('ok')", "stdin": ""})
    finally:
        box.close()
    if r.status == "ok" and r.stdout.strip() == b"ok" and r.report.get("isolation") == isolation:
        return True, ""
    return False, r.message or f"probe status {r.status}"
