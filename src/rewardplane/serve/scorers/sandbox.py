"""A local sandbox for running untrusted Python: a resource boundary, NOT a security boundary.

Stdlib only: this file is also the *zygote*, started as `python -I sandbox.py --zygote <config>`,
so that the processes that run code are forks of a small, warm interpreter (no torch, no server
threads, a few MiB of address space) instead of fresh interpreters (~37 ms) or forks of the server.

Layout, per run:

    scorer thread (server) --SEQPACKET + SCM_RIGHTS--> zygote --fork--> unit (outer child)
                                                                         `--fork--> runner

The zygote keeps `prefork` units ready. A unit, right after its fork: `setsid()`; when the
server runs as root, drops to uid/gid 65534 (so RLIMIT_NPROC means something); with
`isolation: namespaces` it `unshare`s user + mount + network + PID + IPC namespaces, makes every
mount read-only (`mount_setattr(AT_RECURSIVE, MOUNT_ATTR_RDONLY)`), mounts a fresh size-capped
tmpfs on /tmp (HOME and the working directory live in it), and forks the runner, which is PID 1 of
the new PID namespace (when it dies, the kernel kills everything it started — fork bombs
included). The runner drops every capability, sets no_new_privs and waits on a socket for a job.
A job brings three pipes (job in, stdout out, result out); the runner reads the job, sets the
rlimits (CPU time, address space, file size, open files, processes, no core), puts the stdin
data on fd 0 (a memfd), and `exec`s the code in-process. The wall-clock limit and the output cap
are enforced by the server side: it kills the unit's process group (SIGKILL) on expiry.

What it does not do: seccomp filtering, cgroup memory/pids accounting, or protection against
kernel exploits. A determined attacker with a kernel bug gets out. Use `backend: sandbox_fusion`
(or another real sandbox) for hostile code.
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

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_NOSUID = 2
MS_NODEV = 4
MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MNT_DETACH = 2
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
SYS_MOUNT_SETATTR = 442  # x86_64 and aarch64 share this number
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
NOBODY = 65534
EXIT_SETUP_FAILED = 125
HIDE_PATHS = ("/root", "/home", "/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/var/lib/sss", "/run/secrets")
"""Covered inside the namespaces (the runner keeps the server's uid, so it could read them)."""

# ----------------------------------------------------------------------------- libc


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _write_file(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _enter_namespaces(cfg: dict[str, Any]) -> None:
    import ctypes

    libc = _libc()
    uid, gid = os.geteuid(), os.getegid()
    _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC), "unshare")
    _write_file("/proc/self/setgroups", "deny")
    _write_file("/proc/self/uid_map", f"0 {uid} 1")
    _write_file("/proc/self/gid_map", f"0 {gid} 1")
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")

    class MountAttr(ctypes.Structure):
        _fields_ = [
            ("attr_set", ctypes.c_uint64),
            ("attr_clr", ctypes.c_uint64),
            ("propagation", ctypes.c_uint64),
            ("userns_fd", ctypes.c_uint64),
        ]

    attr = MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    _check(
        libc.syscall(
            SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)
        ),
        "mount_setattr(ro)",
    )
    size = f"size={int(cfg['tmpfs_mb'])}m,mode=1777".encode()
    _check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, size), "mount tmpfs /tmp")
    _hide(libc, cfg.get("hide_paths", []), cfg.get("keep_paths", []))


def _hide(libc: Any, hide: list[str], keep: list[str]) -> None:
    """Cover `hide` (home directories, /etc/shadow, ...) with empty tmpfs / /dev/null, then bind
    back the `keep` paths inside them (the interpreter's prefix and site-packages)."""
    staged = []
    for i, path in enumerate(keep):
        if os.path.isdir(path) and any(path == h or path.startswith(h.rstrip("/") + "/") for h in hide):
            stage = f"/tmp/.keep{i}"
            os.mkdir(stage)
            _check(libc.mount(path.encode(), stage.encode(), None, MS_BIND | MS_REC, None), f"bind {path}")
            staged.append((stage, path))
    for path in hide:
        if os.path.isdir(path) and not os.path.islink(path):
            _check(
                libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,mode=755"), path
            )
        elif os.path.isfile(path):
            _check(libc.mount(b"/dev/null", path.encode(), None, MS_BIND, None), f"hide {path}")
    for stage, path in staged:
        os.makedirs(path, exist_ok=True)
        _check(libc.mount(stage.encode(), path.encode(), None, MS_BIND | MS_REC, None), f"rebind {path}")
        _check(libc.umount2(stage.encode(), MNT_DETACH), f"umount {stage}")
        os.rmdir(stage)
    if staged:  # the re-created path components and the covering tmpfs stay read-only
        for path in hide:
            if os.path.isdir(path) and not os.path.islink(path):
                libc.mount(None, path.encode(), None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)


def _drop_capabilities() -> None:
    import ctypes

    libc = _libc()

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [
            ("effective", ctypes.c_uint32),
            ("permitted", ctypes.c_uint32),
            ("inheritable", ctypes.c_uint32),
        ]

    hdr = Header(0x20080522, 0)
    data = (Data * 2)()
    _check(libc.capset(ctypes.byref(hdr), ctypes.byref(data)), "capset")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(no_new_privs)")


# ----------------------------------------------------------------------------- runner (in the sandbox)


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def _set_rlimits(cfg: dict[str, Any]) -> None:
    import resource

    cpu = int(cfg["cpu_s"])
    mem = int(cfg["memory_mb"]) * 1024 * 1024
    fsize = int(cfg["max_file_mb"]) * 1024 * 1024
    for res, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (mem, mem)),
        (resource.RLIMIT_FSIZE, (fsize, fsize)),
        (resource.RLIMIT_NOFILE, (int(cfg["max_open_files"]),) * 2),
        (resource.RLIMIT_NPROC, (int(cfg["max_processes"]),) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(res, value)


def _split_tests(tests: str) -> tuple[list[str], list[str]]:
    """(setup statements, case statements): each top-level statement that is not an import,
    def, class or assignment is one case; a script without any is one case."""
    import ast

    tree = ast.parse(tests)
    setup_types = (
        ast.Import,
        ast.ImportFrom,
        ast.FunctionDef,
        ast.AsyncFunctionDef,
        ast.ClassDef,
        ast.Assign,
    )
    setup, cases = [], []
    for node in tree.body:
        src = ast.get_source_segment(tests, node) or ""
        if isinstance(node, setup_types) and not cases:
            setup.append(src)
        else:
            cases.append(src)
    return setup, cases


def _runner_main(cfg: dict[str, Any], unit_sock: socket.socket) -> None:
    """PID 1 of the sandbox: wait for a job, run it, report, exit."""
    msg, fds, _, _ = socket.recv_fds(unit_sock, 64, 3)
    if not fds:
        os._exit(0)  # the zygote is going away
    job_r, out_w, res_w = fds
    job = json.loads(_read_all(job_r))
    os.close(job_r)
    stdin_fd = os.memfd_create("stdin")
    os.write(stdin_fd, job.get("stdin", "").encode())
    os.lseek(stdin_fd, 0, os.SEEK_SET)
    devnull = os.open(os.devnull, os.O_WRONLY)
    high = [os.dup(fd) for fd in (stdin_fd, out_w, devnull, res_w)]
    for target, fd in enumerate(high):
        os.dup2(fd, target)
    os.closerange(4, 1 << 16)
    import builtins
    import io

    report: dict[str, Any] = {"isolation": cfg["isolation"]}
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=False)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False))
    res = io.FileIO(3, "w", closefd=True)
    try:
        _set_rlimits(cfg)
    except Exception as exc:
        res.write(json.dumps({"setup_error": f"rlimits: {exc}"}).encode())
        os._exit(EXIT_SETUP_FAILED)

    def run(source: str, namespace: dict[str, Any], filename: str) -> str | None:
        """None when it ran to the end (or exited 0); else a short error name."""
        try:
            exec(compile(source, filename, "exec"), namespace)
        except SystemExit as exc:
            if exc.code not in (None, 0):
                return f"SystemExit({exc.code!r})"
        except MemoryError:
            report["memory"] = True
            return "MemoryError"
        except RecursionError:
            return "RecursionError"
        except OSError as exc:
            if exc.errno in (27, 28):  # EFBIG (RLIMIT_FSIZE; Python ignores SIGXFSZ), ENOSPC (tmpfs full)
                report["file_limit"] = True
            return type(exc).__name__
        except BaseException as exc:
            return type(exc).__name__
        return None

    ns: dict[str, Any] = {"__builtins__": builtins}
    if job["mode"] == "stdin":
        ns["__name__"] = "__main__"
        err = run(job["code"], ns, "<solution>")
        report["error"] = err
    else:
        ns["__name__"] = "solution"
        err = run(job["code"], ns, "<solution>")
        setup, cases = _split_tests(job["tests"])
        passed = 0
        if err is None:
            for stmt in setup:
                err = run(stmt, ns, "<tests>") or err
            if err is None:
                passed = sum(run(case, ns, "<tests>") is None for case in cases)
        report.update(error=err, passed=passed, total=max(1, len(cases)) if cases else 1)
        if not cases:
            report["passed"] = int(err is None)
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
    try:
        res.write(json.dumps(report).encode())
        res.close()
    except BaseException:
        pass
    os._exit(0)


# ----------------------------------------------------------------------------- unit + zygote


def _unit_main(cfg: dict[str, Any], unit_sock: socket.socket) -> None:
    """The outer child: isolate, then fork the runner and wait for it; exit with its status."""
    try:
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.setsid()
        if cfg.get("cgroup"):
            _join_cgroup(cfg["cgroup"], int(cfg["max_processes"]))
        if os.geteuid() == 0 and cfg.get("drop_root"):
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
        if cfg["isolation"] == "namespaces":
            _enter_namespaces(cfg)
            workdir = "/tmp/work"
        else:
            import tempfile

            workdir = tempfile.mkdtemp(prefix="rk-sandbox-")
        pid = os.fork()
    except Exception as exc:
        sys.stderr.write(f"sandbox unit setup failed: {exc}\n")
        os._exit(EXIT_SETUP_FAILED)
    if pid == 0:
        try:
            _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            os.makedirs(workdir, exist_ok=True)
            os.makedirs("/tmp/home" if cfg["isolation"] == "namespaces" else workdir, exist_ok=True)
            os.chdir(workdir)
            os.environ.clear()
            os.environ.update(
                HOME="/tmp/home" if cfg["isolation"] == "namespaces" else workdir,
                PATH="/usr/bin:/bin",
                LANG="C.UTF-8",
                TMPDIR=workdir,
                PYTHONHASHSEED="0",
            )
            if cfg["isolation"] == "namespaces":
                # a /proc of the new PID namespace: the host's processes are not visible
                _check(
                    _libc().mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | 8, None), "mount /proc"
                )
                _drop_capabilities()
            _runner_main(cfg, unit_sock)
        except BaseException as exc:
            sys.stderr.write(f"sandbox runner failed: {exc!r}\n")
            os._exit(EXIT_SETUP_FAILED)
        os._exit(0)
    unit_sock.close()
    _, status = os.waitpid(pid, 0)
    if cfg["isolation"] != "namespaces":
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


def _join_cgroup(base: str, max_processes: int) -> None:
    """Move this unit into its own pids cgroup (`pids.max` = max_processes): a fork bomb stops
    there even for root, whom RLIMIT_NPROC does not bind."""
    path = os.path.join(base, f"u{os.getpid()}")
    os.mkdir(path)
    _write_file(os.path.join(path, "pids.max"), str(max_processes))
    _write_file(os.path.join(path, "cgroup.procs"), "0")


def _rm_cgroups(base: str, pids: list[int]) -> list[int]:
    """rmdir the reaped units' cgroups; returns those still busy (retried later)."""
    busy = []
    for pid in pids:
        try:
            os.rmdir(os.path.join(base, f"u{pid}"))
        except FileNotFoundError:
            pass
        except OSError:
            busy.append(pid)
    return busy


def _zygote_main(ctl_fd: int, cfg: dict[str, Any]) -> None:
    import gc

    for mod in ("ast", "builtins", "io", "json", "resource", "tempfile", "shutil", "ctypes", "re", "math"):
        __import__(mod)
    for mod in cfg.get("preimport", []):
        with contextlib.suppress(ImportError):
            __import__(mod)
    gc.collect()
    gc.freeze()
    ctl = socket.socket(fileno=ctl_fd)
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ, ("ctl", None))
    ready: list[tuple[int, socket.socket, int]] = []  # (pid, sock, pidfd)
    running: dict[int, tuple[int, int]] = {}  # pidfd -> (job id, pid)
    idle_pidfds: dict[int, int] = {}
    cgroup_busy: list[int] = []
    if cfg.get("cgroup"):
        os.makedirs(cfg["cgroup"], exist_ok=True)

    def fork_unit() -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                sel.close()
                ctl.close()
                mine.close()
                for _, s, pfd in ready:
                    s.close()
                    os.close(pfd)
                _unit_main(cfg, theirs)
            finally:
                os._exit(EXIT_SETUP_FAILED)
        theirs.close()
        pidfd = os.pidfd_open(pid)
        ready.append((pid, mine, pidfd))
        idle_pidfds[pidfd] = pid
        sel.register(pidfd, selectors.EVENT_READ, ("idle", pidfd))

    def shutdown(*_: Any) -> None:
        pids = [pid for pid, _, _ in ready] + [pid for _, pid in running.values()]
        for pid in pids:
            _kill_group(pid)
        if cfg.get("cgroup"):
            for pid in pids:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
            left = pids + cgroup_busy
            for _ in range(100):  # namespace teardown can lag on a loaded host
                left = _rm_cgroups(cfg["cgroup"], left)
                if not left:
                    break
                time.sleep(0.05)
            with contextlib.suppress(OSError):
                os.rmdir(cfg["cgroup"])
        os._exit(0)

    # Ctrl-C reaches the whole foreground process group: the server shuts down and closes the
    # socket, which ends the zygote; a SIGTERM of its own cleans up the same way.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, shutdown)

    def send(obj: dict[str, Any]) -> None:
        ctl.send(json.dumps(obj).encode())

    for _ in range(int(cfg["prefork"])):
        fork_unit()
    while True:
        events = sel.select(timeout=0.5)
        if cgroup_busy:
            cgroup_busy[:] = _rm_cgroups(cfg["cgroup"], cgroup_busy)
        for key, _ in events:
            kind, pidfd = key.data
            if kind == "ctl":
                try:
                    data, fds, _, _ = socket.recv_fds(ctl, 1 << 16, 3)
                except OSError:
                    data = b""
                if not data:  # the server went away: take every unit with us
                    shutdown()
                msg = json.loads(data)
                if msg["op"] == "run":
                    if not ready:
                        fork_unit()
                    pid, usock, upidfd = ready.pop(0)
                    sel.unregister(upidfd)
                    idle_pidfds.pop(upidfd, None)
                    try:
                        socket.send_fds(usock, [b"job"], fds)
                        running[upidfd] = (msg["id"], pid)
                        sel.register(upidfd, selectors.EVENT_READ, ("run", upidfd))
                        send({"op": "started", "id": msg["id"], "pid": pid})
                    except OSError as exc:
                        _kill_group(pid)
                        os.waitpid(pid, 0)
                        os.close(upidfd)
                        send({"op": "failed", "id": msg["id"], "message": f"sandbox unit unusable: {exc}"})
                    finally:
                        usock.close()
                        for fd in fds:
                            os.close(fd)
                    while len(ready) < int(cfg["prefork"]):
                        fork_unit()
            elif kind == "run":
                job_id, pid = running.pop(pidfd)
                sel.unregister(pidfd)
                _, status = os.waitpid(pid, 0)
                os.close(pidfd)
                code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                send({"op": "exit", "id": job_id, "code": code})
                if cfg.get("cgroup"):
                    cgroup_busy[:] = _rm_cgroups(cfg["cgroup"], [*cgroup_busy, pid])
            else:  # an idle unit died (setup failed): drop it; runs fork fresh ones on demand
                sel.unregister(pidfd)
                pid = idle_pidfds.pop(pidfd)
                os.waitpid(pid, 0)
                os.close(pidfd)
                if cfg.get("cgroup"):
                    cgroup_busy[:] = _rm_cgroups(cfg["cgroup"], [*cgroup_busy, pid])
                for i, (p, s, _) in enumerate(ready):
                    if p == pid:
                        s.close()
                        del ready[i]
                        break


def _kill_group(pid: int) -> None:
    for fn in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            fn(pid, signal.SIGKILL)


# ----------------------------------------------------------------------------- server side


@dataclass
class RunResult:
    """status: ok | timeout | memory_limit | output_limit | sandbox_error."""

    status: str
    stdout: bytes = b""
    report: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    message: str = ""
    wall_s: float = 0.0


class _Waiter:
    def __init__(self) -> None:
        self.started = threading.Event()
        self.exited = threading.Event()
        self.pid: int | None = None
        self.code: int | None = None
        self.failure: str | None = None


class LocalSandbox:
    """Server-side handle of one zygote. Thread-safe: `run()` may be called from many threads."""

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
        preimport: tuple[str, ...] = (),
        hide_paths: tuple[str, ...] = HIDE_PATHS,
    ) -> None:
        if isolation not in ("namespaces", "rlimits"):
            raise ValueError("isolation must be namespaces or rlimits")
        self.timeout_s = timeout_s
        self.max_output_bytes = max_output_bytes
        self.cfg = {
            "isolation": isolation,
            "cpu_s": max(1, int(timeout_s + 0.999)),
            "memory_mb": memory_mb,
            "max_file_mb": max_file_mb,
            "max_open_files": max_open_files,
            "max_processes": max_processes,
            "tmpfs_mb": tmpfs_mb,
            "prefork": prefork,
            "preimport": list(preimport),
            "drop_root": os.geteuid() == 0 and _world_readable_stdlib(),
            "hide_paths": list(hide_paths),
            "keep_paths": _interpreter_paths(),
            "cgroup": _pids_cgroup_base(),
        }
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
            [
                sys.executable,
                "-I",
                os.path.abspath(__file__),
                "--zygote",
                str(theirs.fileno()),
                json.dumps(self.cfg),
            ],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
        )
        theirs.close()
        self._ctl = mine
        self.restarts += 1
        threading.Thread(target=self._reader, args=(mine,), daemon=True, name="sandbox-ctl").start()

    def _reader(self, ctl: socket.socket) -> None:
        while True:
            try:
                data = ctl.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                with self._lock:
                    if self._ctl is ctl:
                        self._ctl = None
                    waiters = list(self._waiters.values())
                for w in waiters:
                    w.failure = w.failure or "the sandbox zygote exited"
                    w.started.set()
                    w.exited.set()
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

    def run(self, job: dict[str, Any], timeout_s: float | None = None) -> RunResult:
        """Run one job: {"mode": "stdin", "code", "stdin"} or {"mode": "assert", "code", "tests"}."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        t0 = time.monotonic()
        job_r, job_w = os.pipe()
        out_r, out_w = os.pipe()
        res_r, res_w = os.pipe()
        w = _Waiter()
        still_open = {job_w, out_r, res_r}
        with self._lock:
            if self._ctl is None:
                self.start()
            ctl = self._ctl
            self._next_id += 1
            job_id = self._next_id
            self._waiters[job_id] = w
        try:
            try:
                socket.send_fds(
                    ctl, [json.dumps({"op": "run", "id": job_id}).encode()], [job_r, out_w, res_w]
                )
            except OSError as exc:
                return RunResult("sandbox_error", message=f"cannot reach the sandbox zygote: {exc}")
            finally:
                for fd in (job_r, out_w, res_w):
                    os.close(fd)
            result = self._pump(
                w, json.dumps(job).encode(), job_w, out_r, res_r, t0 + timeout_s, timeout_s, still_open
            )
        finally:
            with self._lock:
                self._waiters.pop(job_id, None)
            for fd in still_open:  # never close twice: another thread may own the number by now
                os.close(fd)
        result.wall_s = time.monotonic() - t0
        return result

    def _pump(
        self,
        w: _Waiter,
        payload: bytes,
        job_w: int,
        out_r: int,
        res_r: int,
        deadline: float,
        timeout_s: float,
        still_open: set[int],
    ) -> RunResult:
        for fd in (job_w, out_r, res_r):
            os.set_blocking(fd, False)
        sel = selectors.DefaultSelector()
        sel.register(job_w, selectors.EVENT_WRITE)
        sel.register(out_r, selectors.EVENT_READ)
        sel.register(res_r, selectors.EVENT_READ)
        out, res = bytearray(), bytearray()
        open_reads = {out_r, res_r}
        sent = 0
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
                    if fd == job_w:
                        try:
                            sent += os.write(job_w, payload[sent : sent + (1 << 16)])
                        except BlockingIOError:
                            continue
                        except BrokenPipeError:
                            sent = len(payload)
                        if sent >= len(payload):
                            sel.unregister(job_w)
                            still_open.discard(job_w)
                            os.close(job_w)
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
                    if fd == res_r and len(res) > 1 << 20:
                        status = "sandbox_error"
                        open_reads.clear()
                        break
        finally:
            sel.close()
        if status is not None or not w.exited.wait(max(0.0, deadline - time.monotonic())):
            w.started.wait(1.0)
            if w.pid is not None:
                _kill_group(w.pid)
            w.exited.wait(2.0)
            status = status or "timeout"
        if w.failure:
            return RunResult("sandbox_error", message=w.failure)
        code = w.code
        if status == "timeout":
            return RunResult(
                "timeout", bytes(out), exit_code=code, message=f"wall-clock limit {timeout_s:g} s"
            )
        if status == "output_limit":
            return RunResult(
                "output_limit", exit_code=code, message=f"stdout over {self.max_output_bytes} bytes; killed"
            )
        if status == "sandbox_error":
            return RunResult("sandbox_error", message="oversized result record")
        try:
            report = json.loads(bytes(res)) if res else {}
        except ValueError:
            report = {}
        if code == EXIT_SETUP_FAILED or "setup_error" in report:
            return RunResult(
                "sandbox_error", exit_code=code, message=report.get("setup_error", "sandbox setup failed")
            )
        if code == 128 + signal.SIGXCPU:
            return RunResult("timeout", exit_code=code, message=f"CPU-time limit {self.cfg['cpu_s']} s")
        if code == 128 + signal.SIGXFSZ:
            return RunResult(
                "output_limit", exit_code=code, message=f"file size limit {self.cfg['max_file_mb']} MiB"
            )
        if report.get("file_limit"):
            return RunResult(
                "output_limit",
                exit_code=code,
                message=f"file size limit {self.cfg['max_file_mb']} MiB or tmpfs full",
            )
        if report.get("memory") or (code == 128 + signal.SIGKILL and not report):
            return RunResult(
                "memory_limit", exit_code=code, message=f"address-space limit {self.cfg['memory_mb']} MiB"
            )
        return RunResult("ok", bytes(out), report, exit_code=code)


def _interpreter_paths() -> list[str]:
    """What a hidden path must keep visible: the interpreter's prefixes and package dirs."""
    import site
    import sysconfig

    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, *sysconfig.get_paths().values()}
    with contextlib.suppress(AttributeError):  # some embedded interpreters lack it
        paths.update(site.getsitepackages())
    paths.add(os.path.dirname(os.path.realpath(sys.executable)))
    out = sorted({os.path.realpath(p) for p in paths if p and os.path.isdir(p)})
    # only the outermost of nested paths: binding a parent brings its children
    return [p for p in out if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in out)]


def _world_readable_stdlib() -> bool:
    """Dropping root to uid 65534 only works when that uid can read the interpreter's stdlib."""
    import sysconfig

    path = os.path.realpath(sysconfig.get_paths()["stdlib"])
    while True:
        try:
            if os.stat(path).st_mode & 0o005 != 0o005:
                return False
        except OSError:
            return False
        if path == "/":
            return True
        path = os.path.dirname(path)


def _pids_cgroup_base() -> str | None:
    """A writable pids cgroup (v1 hierarchy, or v2 with the pids controller) for per-unit caps."""
    candidates = ["/sys/fs/cgroup/pids"]
    try:
        with open("/sys/fs/cgroup/cgroup.controllers") as f:
            if "pids" in f.read().split():
                candidates.append("/sys/fs/cgroup")
    except OSError:
        pass
    for base in candidates:
        if os.path.isfile(os.path.join(base, "cgroup.procs")) and os.access(base, os.W_OK):
            return os.path.join(base, f"rewardplane-sandbox-{os.getpid()}-{id(object())}")
    return None


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


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--zygote":
    _zygote_main(int(sys.argv[2]), json.loads(sys.argv[3]))
