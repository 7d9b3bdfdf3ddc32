"""The zygote: a small, warm interpreter that pre-forks the units that run untrusted code.

Started by the server (`sandbox.LocalSandbox.start`) as `python -I zygote.py --zygote <fd> <cfg>`,
so that the processes that run code are forks of a small interpreter (no torch, no server
threads, a few MiB of address space) instead of fresh interpreters (~37 ms) or forks of the server.
Stdlib only; its siblings (`rootfs.py`, `limits.py`, `harness.py`) are loaded by file path, never
through the package (the zygote runs isolated from the server's `sys.path`).

Layout, per run:

    scorer thread (server) --SEQPACKET + SCM_RIGHTS--> zygote --fork--> unit (outer child)
                                                                         `--fork--> runner

A unit, right after its fork: `setsid()`; joins its own pids cgroup when one is writable; when
the server runs as root, drops to uid/gid 65534 (so RLIMIT_NPROC means something); with
`isolation: namespaces` it enters new namespaces (`rootfs.enter_namespaces`) and forks the
runner, which is PID 1 of the new PID namespace (when it dies, the kernel kills everything it
started — fork bombs included), mounts its /proc, drops every capability and waits on a socket
for a job (`harness.runner_main`).
"""

from __future__ import annotations

import contextlib
import json
import os
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


def unit_main(cfg: dict[str, Any], unit_sock: socket.socket) -> None:
    """The outer child: isolate, then fork the runner and wait for it; exit with its status."""
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
            rootfs.enter_namespaces(cfg)
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
            rootfs.load_libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
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
                rootfs.mount_proc()  # a /proc of the new PID namespace: no host processes
                rootfs.drop_capabilities()
            harness.runner_main(cfg, unit_sock, limits.set_rlimits)
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


def zygote_main(ctl_fd: int, cfg: dict[str, Any]) -> None:
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
                unit_main(cfg, theirs)
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
            kill_group(pid)
        if cfg.get("cgroup"):
            for pid in pids:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
            left = pids + cgroup_busy
            for _ in range(100):  # namespace teardown can lag on a loaded host
                left = limits.rm_cgroups(cfg["cgroup"], left)
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
            cgroup_busy[:] = limits.rm_cgroups(cfg["cgroup"], cgroup_busy)
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
                        kill_group(pid)
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
                    cgroup_busy[:] = limits.rm_cgroups(cfg["cgroup"], [*cgroup_busy, pid])
            else:  # an idle unit died (setup failed): drop it; runs fork fresh ones on demand
                sel.unregister(pidfd)
                pid = idle_pidfds.pop(pidfd)
                os.waitpid(pid, 0)
                os.close(pidfd)
                if cfg.get("cgroup"):
                    cgroup_busy[:] = limits.rm_cgroups(cfg["cgroup"], [*cgroup_busy, pid])
                for i, (p, s, _) in enumerate(ready):
                    if p == pid:
                        s.close()
                        del ready[i]
                        break


def kill_group(pid: int) -> None:
    for fn in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            fn(pid, signal.SIGKILL)


def main(argv: list[str]) -> None:
    global rootfs, limits, harness
    rootfs, limits, harness = _sibling("rootfs"), _sibling("limits"), _sibling("harness")
    zygote_main(int(argv[2]), json.loads(argv[3]))


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--zygote":
    main(sys.argv)
