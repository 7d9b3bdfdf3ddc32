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
drops every capability and waits for its job. Per run the zygote sends the program's process
its job and stdout pipes (and the records' nonce) on one socket, and the unit the result pipe and
the run's secret on another, which the program's process closed before any job existed. The unit
makes itself undumpable and relays the program's records (`channel.relay`), out of its reach.
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
channel: Any = None


def unit_main(cfg: dict[str, Any], unit_sock: socket.socket, job_sock: socket.socket) -> None:
    """The unit: isolate, fork the program's process (PID 1 of the new PID namespace) before any
    job exists, then wait for the run's secret and result pipe on `unit_sock` (the program's
    process gets its job on `job_sock`); relay its records to the server framed with the secret
    (`channel.relay`) and exit with its status. The program cannot reach this process: it is
    outside the program's PID namespace (no pid to signal, trace or read in /proc) and
    undumpable."""
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
        records_r, records_w = os.pipe()
        pid = os.fork()
    except Exception as exc:
        sys.stderr.write(f"sandbox unit setup failed: {exc}\n")
        os._exit(EXIT_SETUP_FAILED)
    if pid == 0:  # the program's process: it never holds what arrives on unit_sock
        try:
            unit_sock.close()
            os.close(records_r)
            program_main(cfg, job_sock, records_w, workdir)
        except BaseException as exc:
            sys.stderr.write(f"sandbox program process failed: {exc!r}\n")
        os._exit(EXIT_SETUP_FAILED)
    job_sock.close()
    os.close(records_w)
    try:
        rootfs.make_undumpable()
        # the zygote kills the program's process by this handle when the unit ends, however it
        # ends: a program that left the unit's process group and its parent-death signal still dies
        handle = os.pidfd_open(pid)
        socket.send_fds(unit_sock, [b"pidfd"], [handle])
        os.close(handle)
        msg, fds, _, _ = socket.recv_fds(unit_sock, 256, 1)
    except Exception:
        fds = []
    if len(fds) != 1:  # the zygote is going away (or this unit is unusable)
        kill_group(pid)
        os._exit(0)
    (res_w,) = fds
    secret, _, nonce = msg.partition(b" ")
    code = channel.relay(secret, nonce, records_r, pid, res_w, {"isolation": cfg["isolation"]})
    if workdir:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    os._exit(code)


def program_main(cfg: dict[str, Any], job_sock: socket.socket, records_w: int, workdir: str) -> None:
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
    harness.child_main(cfg, job_sock, records_w, limits.set_rlimits)


def zygote_main(ctl: socket.socket, cfg: dict[str, Any]) -> None:
    import gc

    sys.path.extend(cfg["root"]["sys_path"])  # the allowed packages' directories (see rootfs.plan)
    for mod in ("ast", "builtins", "io", "json", "resource", "tempfile", "shutil", "ctypes", "re", "math"):
        __import__(mod)
    for mod in ("platform", "selectors", "importlib.util", *cfg.get("preimport", [])):
        with contextlib.suppress(ImportError):
            __import__(mod)
    gc.collect()
    gc.freeze()
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ, ("ctl", None))
    ready: list[tuple[int, socket.socket, socket.socket, int]] = []  # (pid, unit's, program's, pidfd)
    running: dict[int, tuple[int, int, int | None]] = {}  # pidfd -> (job id, pid, program's pidfd)
    idle_pidfds: dict[int, int] = {}
    cgroup_busy: list[int] = []
    if cfg.get("cgroup"):
        os.makedirs(cfg["cgroup"], exist_ok=True)

    def fork_unit() -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # the unit's
        to_prog, prog = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # its program's
        pid = os.fork()
        if pid == 0:
            try:
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                sel.close()
                ctl.close()
                mine.close()
                to_prog.close()
                for _, s, ps, pfd in ready:
                    s.close()
                    ps.close()
                    os.close(pfd)
                for pfd, (_, _, handle) in running.items():
                    os.close(pfd)
                    if handle is not None:
                        os.close(handle)
                unit_main(cfg, theirs, prog)
            finally:
                os._exit(EXIT_SETUP_FAILED)
        theirs.close()
        prog.close()
        pidfd = os.pidfd_open(pid)
        ready.append((pid, mine, to_prog, pidfd))
        idle_pidfds[pidfd] = pid
        sel.register(pidfd, selectors.EVENT_READ, ("idle", pidfd))

    def shutdown(*_: Any) -> None:
        pids = [pid for pid, _, _, _ in ready] + [pid for _, pid, _ in running.values()]
        for _, _, handle in running.values():
            kill_program(handle)
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
                    pid, usock, psock, upidfd = ready.pop(0)
                    sel.unregister(upidfd)
                    idle_pidfds.pop(upidfd, None)
                    try:  # the program gets its job and stdout; only the unit the secret and result pipe
                        usock.settimeout(10.0)  # a unit still setting up sends its program's handle first
                        _, handles, _, _ = socket.recv_fds(usock, 16, 1)
                        handle = handles[0] if handles else None
                        nonce = os.urandom(16).hex().encode()
                        socket.send_fds(psock, [nonce], fds[:2])
                        socket.send_fds(usock, [msg["secret"].encode() + b" " + nonce], fds[2:])
                        running[upidfd] = (msg["id"], pid, handle)
                        sel.register(upidfd, selectors.EVENT_READ, ("run", upidfd))
                        send({"op": "started", "id": msg["id"], "pid": pid})
                    except OSError as exc:
                        kill_group(pid)
                        os.waitpid(pid, 0)
                        os.close(upidfd)
                        send({"op": "failed", "id": msg["id"], "message": f"sandbox unit unusable: {exc}"})
                    finally:
                        usock.close()
                        psock.close()
                        for fd in fds:
                            os.close(fd)
                    while len(ready) < int(cfg["prefork"]):
                        fork_unit()
            elif kind == "run":
                job_id, pid, handle = running.pop(pidfd)
                kill_program(handle)
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
                for i, (p, s, ps, _) in enumerate(ready):
                    if p == pid:
                        s.close()
                        ps.close()
                        del ready[i]
                        break


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
    global rootfs, limits, harness, channel
    rootfs, limits, harness, channel = (_sibling(n) for n in ("rootfs", "limits", "harness", "channel"))
    ctl = socket.socket(fileno=int(argv[2]))
    msg = json.loads(ctl.recv(1 << 22))  # the configuration comes first, never on the command line
    zygote_main(ctl, msg["cfg"])


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--zygote":
    main(sys.argv)
