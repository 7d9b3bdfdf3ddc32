"""The zygote: a small, warm interpreter that pre-forks the units that run untrusted code.

Started by the server (`sandbox.LocalSandbox.start`) as `python -I -S zygote.py --zygote <fd>`
from an explicit environment (never the server's), with its configuration sent as the first
message on that socket (never on the command line, which /proc shows). The processes that run
code are forks of this small interpreter (no torch, no server threads, no site-packages but the
allowed ones) instead of fresh interpreters (~37 ms) or forks of the server. Stdlib only; its
siblings (`rootfs.py`, `limits.py`, `harness.py`, `channel.py`) are loaded by file path, never
through the package (an isolated interpreter: the server's `sys.path` is not its own).

Layout, per run:

    server --SEQPACKET + SCM_RIGHTS--> zygote --fork--> unit --fork--> program's process

All of it happens before a job exists (`prefork` units are kept ready). The unit: `setsid()`;
joins its own pids cgroup when one is writable; when the server runs as root and the
interpreter is world-readable, drops to uid/gid 65534 (so RLIMIT_NPROC means something); with
`isolation: namespaces` it enters new user, mount, network, PID and IPC namespaces and forks the
program's process, PID 1 of the new PID namespace (when it dies, the kernel kills everything in
it — fork bombs included), which builds the minimal root, pivots into it (`rootfs.build_root`),
drops every capability and waits for its job. Per run the zygote sends the program's process its
job and stdout pipes and the records' nonce; the result pipe and the run's secret stay in the
zygote, which reads the program's records pipe and writes the framed report when the unit ends
(`Unit.finish`, `channel.Records`). The unit passes on how the program's process ended and
hands the zygote a pidfd of it, by which the zygote kills it when the unit ends. For a `calls`
job (assert-style tests) the zygote also hands the unit the tests' pipe: the unit — outside the
program's PID namespace, undumpable, with a socket to the program made before the fork — becomes
the trusted evaluator (`evaluator.py`) and sends its verdict with the program's wait status.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import selectors
import signal
import socket
import sys
import time
from typing import Any

PR_SET_PDEATHSIG = 1
NOBODY = 65534
EXIT_SETUP_FAILED = 125
HERE = os.path.dirname(os.path.abspath(__file__))


def _sibling(name: str) -> Any:
    """A sibling module loaded by its file path (the zygote never imports the package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        f"_rewardplane_sandbox_{name}", os.path.join(HERE, f"{name}.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rootfs: Any = None
limits: Any = None
harness: Any = None
channel: Any = None
evaluator: Any = None


def unit_main(cfg: dict[str, Any], unit_sock: socket.socket, job_sock: socket.socket, records_w: int) -> None:
    """The unit: isolate, fork the program's process (PID 1 of the new PID namespace) before any
    job exists, hand the zygote a pidfd of it; for a `calls` job become the trusted evaluator
    (`evaluator.py`), then wait for the program and pass on how it ended, with the verdict."""
    try:
        rootfs.load_libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.setsid()
        if cfg.get("cgroup"):
            limits.join_cgroup(cfg["cgroup"], int(cfg["max_processes"]))
        if os.geteuid() == 0 and cfg.get("drop_root"):
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
        if cfg["isolation"] == "namespaces":
            rootfs.enter_namespaces()
            workdir = ""
        else:
            import tempfile

            workdir = tempfile.mkdtemp(prefix="rp-sandbox-")
        calls, program_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
    except Exception as exc:
        sys.stderr.write(f"sandbox unit setup failed: {exc}\n")
        os._exit(EXIT_SETUP_FAILED)
    if pid == 0:
        try:
            unit_sock.close()
            calls.close()
            program_main(cfg, job_sock, records_w, workdir, program_end.fileno())
        except BaseException as exc:
            sys.stderr.write(f"sandbox program process failed: {exc!r}\n")
        os._exit(EXIT_SETUP_FAILED)
    job_sock.close()
    program_end.close()
    os.close(records_w)
    status, outcome = None, {}
    try:
        rootfs.make_undumpable()  # the program (same uid in rlimits mode) cannot trace the evaluator
        # the zygote kills the program's process by this handle when the unit ends, however it
        # ends: a program that left the unit's process group and its parent-death signal still dies
        handle = os.pidfd_open(pid)
        socket.send_fds(unit_sock, [b"pidfd"], [handle])
        word, fds, _, _ = socket.recv_fds(unit_sock, 16, 1)
        if word == b"eval" and fds:
            outcome["verdict"] = evaluator.evaluate(cfg, fds[0], calls, lambda: _evaluator_limits(cfg))
        calls.close()  # the program's harness sees the end of the calls and exits
        if word == b"eval" and not select.select([handle], [], [], 0.5)[0]:
            os.kill(pid, signal.SIGKILL)  # the verdict is in: a program that lingers is ended
            outcome["killed"] = True
        _, status = os.waitpid(pid, 0)
        outcome["status"] = status  # the exact wait status: an exit code is not a signal
        unit_sock.send(json.dumps(outcome).encode())
    except Exception as exc:
        sys.stderr.write(f"sandbox unit failed: {exc!r}\n")
    if workdir:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    if status is None:
        os._exit(EXIT_SETUP_FAILED)
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


def _evaluator_limits(cfg: dict[str, Any]) -> None:
    """The evaluator's own world, taken once the program has run (its root is built): in
    namespaces mode a mount namespace of its own with a private /tmp (nothing the program writes
    is seen) and no capabilities; the run's rlimits, as for the program."""
    if cfg["isolation"] == "namespaces":
        rootfs.private_tmp(int(cfg["tmpfs_mb"]))
        rootfs.drop_privileges()
    limits.set_rlimits(cfg)


def program_main(
    cfg: dict[str, Any], job_sock: socket.socket, records_w: int, workdir: str, call_fd: int
) -> None:
    """The program's process (PID 1 of the unit's PID namespace: when it dies, the kernel kills
    everything it started — fork bombs included): build the root, drop every privilege, then run
    the job in the harness (`harness.child_main`)."""
    rootfs.load_libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if cfg["isolation"] == "namespaces":
        rootfs.build_root(cfg)
        workdir, home = "/tmp/work", "/tmp/home"
        os.makedirs(home)
    else:
        home = workdir
    os.makedirs(workdir, exist_ok=True)
    os.chdir(workdir)
    os.environ.clear()
    os.environ.update(HOME=home, PATH="/usr/bin:/bin", LANG="C.UTF-8", TMPDIR=workdir, PYTHONHASHSEED="0")
    sys.executable = cfg["executable"]
    rootfs.drop_privileges()
    harness.child_main(cfg, job_sock, records_w, call_fd, limits.set_rlimits)


class Unit:
    """The zygote's handle on one unit: its sockets, its records pipe, and once it runs a job,
    the job's id, result pipe, secret and records."""

    def __init__(self, pid: int, sock: socket.socket, prog: socket.socket, records_r: int) -> None:
        self.pid, self.sock, self.prog, self.records_r = pid, sock, prog, records_r
        self.pidfd = os.pidfd_open(pid)
        self.job_id = 0
        self.res_w: int | None = None
        self.secret = b""
        self.handle: int | None = None  # a pidfd of its program's process
        self.records: Any = None

    def fds(self) -> list[int]:
        extra = [fd for fd in (self.res_w, self.handle) if fd is not None]
        return [self.sock.fileno(), self.prog.fileno(), self.records_r, self.pidfd, *extra]

    def start(self, job_id: int, secret: bytes, fds: list[int]) -> None:
        """Hand the job to the program's process (job and stdout pipes, the records' nonce) and
        keep the result pipe and the secret here."""
        self.sock.settimeout(10.0)  # a unit still setting up sends its program's handle first
        _, handles, _, _ = socket.recv_fds(self.sock, 16, 1)
        self.handle = handles[0] if handles else None
        nonce = os.urandom(16).hex().encode()
        socket.send_fds(self.prog, [nonce], fds[:2])
        if len(fds) > 3:  # a `calls` job: the unit becomes its evaluator, with the tests' pipe
            socket.send_fds(self.sock, [b"eval"], [fds[3]])
        else:
            self.sock.send(b"wait")
        self.job_id, self.secret, self.res_w = job_id, secret, os.dup(fds[2])
        self.records = channel.Records(nonce)
        os.set_blocking(self.records_r, False)

    def read_records(self) -> bool:
        """Take what the records pipe holds; False at its end."""
        try:
            while chunk := os.read(self.records_r, 1 << 16):
                self.records.feed(chunk)
            return False
        except BlockingIOError:
            return True

    def finish(self, isolation: str) -> int:
        """The unit ended: reap it, report to the server (framed with the secret), return its
        exit code for the server's control message."""
        _, status = os.waitpid(self.pid, 0)
        code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        self.read_records()
        self.records.finish()
        meta: dict[str, Any] = {"isolation": isolation, "exit": None, "signal": None}
        try:
            self.sock.setblocking(False)
            outcome = json.loads(self.sock.recv(1 << 20))
            program = int(outcome["status"])
            meta["signal" if os.WIFSIGNALED(program) else "exit"] = (
                os.WTERMSIG(program) if os.WIFSIGNALED(program) else os.WEXITSTATUS(program)
            )
            meta.update({k: outcome[k] for k in ("verdict", "killed") if k in outcome})
            report = self.records.report(self.secret, meta)
        except (
            OSError,
            ValueError,
            KeyError,
            TypeError,
        ):  # the unit itself was killed: no report (the server decides)
            report = b""
        with contextlib.suppress(OSError):
            os.set_blocking(self.res_w, True)
            view = memoryview(report)
            while view:
                view = view[os.write(self.res_w, view) :]
        self.close()
        return code

    def close(self) -> None:
        kill_program(self.handle)
        self.handle = None
        for fd in (self.res_w, self.records_r, self.pidfd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.res_w = None
        self.sock.close()
        self.prog.close()


def _warm_up(cfg: dict[str, Any]) -> None:
    """Import what every run needs once, here, and freeze it: the forks share these pages."""
    import gc

    rootfs.make_undumpable()
    sys.path.extend(cfg["root"]["sys_path"])  # the allowed packages' directories (see rootfs.plan)
    for mod in ("ast", "builtins", "io", "json", "resource", "tempfile", "shutil", "ctypes", "re", "math"):
        __import__(mod)
    for mod in ("platform", "selectors", "importlib.util", *cfg.get("preimport", [])):
        with contextlib.suppress(ImportError):
            __import__(mod)
    harness.plain.capture()  # numpy's classes, when it is an allowed package
    gc.collect()
    gc.freeze()


class _Zygote:
    """The zygote's loop and its state: units ready to run, units running (by pidfd), and the
    pids whose cgroups the kernel has not let go of yet."""

    def __init__(self, ctl: socket.socket, cfg: dict[str, Any]) -> None:
        self.ctl = ctl
        self.cfg = cfg
        self.sel = selectors.DefaultSelector()
        self.sel.register(ctl, selectors.EVENT_READ, ("ctl", None))
        self.ready: list[Unit] = []
        self.running: dict[int, Unit] = {}  # by the unit's pidfd
        self.cgroup_busy: list[int] = []
        if cfg.get("cgroup"):
            os.makedirs(cfg["cgroup"], exist_ok=True)

    def fork_unit(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # the unit's
        to_prog, prog = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # its program's
        records_r, records_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                self.sel.close()
                self.ctl.close()
                mine.close()
                to_prog.close()
                os.close(records_r)
                # nothing of another unit's run comes along
                for unit in [*self.ready, *self.running.values()]:
                    for fd in unit.fds():
                        os.close(fd)
                unit_main(self.cfg, theirs, prog, records_w)
            finally:
                os._exit(EXIT_SETUP_FAILED)
        theirs.close()
        prog.close()
        os.close(records_w)
        unit = Unit(pid, mine, to_prog, records_r)
        self.ready.append(unit)
        self.sel.register(unit.pidfd, selectors.EVENT_READ, ("idle", unit))

    def shutdown(self, *_: Any) -> None:
        units = [*self.ready, *self.running.values()]
        for unit in units:
            kill_program(unit.handle)
            kill_group(unit.pid)
        if self.cfg.get("cgroup"):
            for unit in units:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(unit.pid, 0)
            left = [u.pid for u in units] + self.cgroup_busy
            for _ in range(100):  # namespace teardown can lag on a loaded host
                left = limits.rm_cgroups(self.cfg["cgroup"], left)
                if not left:
                    break
                time.sleep(0.05)
            with contextlib.suppress(OSError):
                os.rmdir(self.cfg["cgroup"])
        os._exit(0)

    def send(self, obj: dict[str, Any]) -> None:
        self.ctl.send(json.dumps(obj).encode())

    def reaped(self, pid: int) -> None:
        if self.cfg.get("cgroup"):
            self.cgroup_busy[:] = limits.rm_cgroups(self.cfg["cgroup"], [*self.cgroup_busy, pid])

    def serve(self) -> None:
        for _ in range(int(self.cfg["prefork"])):
            self.fork_unit()
        while True:
            events = self.sel.select(timeout=0.5)
            if self.cgroup_busy:
                self.cgroup_busy[:] = limits.rm_cgroups(self.cfg["cgroup"], self.cgroup_busy)
            for key, _ in events:
                kind, unit = key.data
                if kind == "ctl":
                    self.on_request()
                elif kind == "records":
                    if unit.res_w is not None and not unit.read_records():  # (a finished unit: stale)
                        self.sel.unregister(unit.records_r)
                elif kind == "run":
                    self.on_unit_ended(unit)
                else:  # an idle unit died (setup failed): drop it; runs fork fresh ones on demand
                    self.sel.unregister(unit.pidfd)
                    os.waitpid(unit.pid, 0)
                    self.ready.remove(unit)
                    unit.close()
                    self.reaped(unit.pid)

    def on_request(self) -> None:
        """A message from the server: a run hands a ready unit its job's pipes."""
        try:
            data, fds, _, _ = socket.recv_fds(self.ctl, 1 << 16, 4)
        except OSError:
            data = b""
        if not data:  # the server went away: take every unit with us
            self.shutdown()
        msg = json.loads(data)
        if msg["op"] != "run":
            return
        if not self.ready:
            self.fork_unit()
        unit = self.ready.pop(0)
        self.sel.unregister(unit.pidfd)
        try:  # the program gets its job and stdout; the result pipe and secret stay here
            unit.start(msg["id"], msg["secret"].encode(), fds)
            self.running[unit.pidfd] = unit
            self.sel.register(unit.pidfd, selectors.EVENT_READ, ("run", unit))
            self.sel.register(unit.records_r, selectors.EVENT_READ, ("records", unit))
            self.send({"op": "started", "id": msg["id"], "pid": unit.pid})
        except OSError as exc:
            kill_group(unit.pid)
            os.waitpid(unit.pid, 0)
            unit.close()
            self.send({"op": "failed", "id": msg["id"], "message": f"sandbox unit unusable: {exc}"})
        finally:
            for fd in fds:
                os.close(fd)
        while len(self.ready) < int(self.cfg["prefork"]):
            self.fork_unit()

    def on_unit_ended(self, unit: Unit) -> None:
        """A running unit exited: the zygote writes its report and tells the server how it ended."""
        self.running.pop(unit.pidfd)
        self.sel.unregister(unit.pidfd)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(unit.records_r)
        code = unit.finish(self.cfg["isolation"])
        self.send({"op": "exit", "id": unit.job_id, "code": code})
        self.reaped(unit.pid)


def zygote_main(ctl: socket.socket, cfg: dict[str, Any]) -> None:
    _warm_up(cfg)
    zygote = _Zygote(ctl, cfg)
    # Ctrl-C reaches the whole foreground process group: the server shuts down and closes the
    # socket, which ends the zygote; a SIGTERM of its own cleans up the same way.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, zygote.shutdown)
    zygote.serve()


def kill_program(handle: int | None) -> None:
    """SIGKILL a unit's program's process by its pidfd (PID 1 of its namespace: everything in it
    dies with it), then close the handle."""
    if handle is None:
        return
    with contextlib.suppress(OSError):
        signal.pidfd_send_signal(handle, signal.SIGKILL)
    os.close(handle)


def kill_group(pid: int) -> None:
    for fn in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            fn(pid, signal.SIGKILL)


def main(argv: list[str]) -> None:
    global rootfs, limits, harness, channel, evaluator
    names = ("rootfs", "limits", "harness", "channel", "evaluator", "plain")
    rootfs, limits, harness, channel, evaluator, plain = (_sibling(n) for n in names)
    harness.plain = evaluator._plain = plain
    ctl = socket.socket(fileno=int(argv[2]))
    msg = json.loads(ctl.recv(1 << 22))  # the configuration comes first, never on the command line
    zygote_main(ctl, msg["cfg"])


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--zygote":
    main(sys.argv)
