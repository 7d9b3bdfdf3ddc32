"""Per-run limits: the rlimits the program's process sets before the code runs, and the per-unit
pids cgroup that caps processes even for root.

Stdlib only: loaded by file path into the zygote (`zygote.py`); the server imports it as a
package module for `pids_cgroup_base`.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any


def set_rlimits(cfg: dict[str, Any]) -> None:
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


def join_cgroup(base: str, max_processes: int) -> None:
    """Move this unit into its own pids cgroup (`pids.max` = max_processes): a fork bomb stops
    there even for root, whom RLIMIT_NPROC does not bind."""
    path = os.path.join(base, f"u{os.getpid()}")
    os.mkdir(path)
    for name, value in (("pids.max", str(max_processes)), ("cgroup.procs", "0")):
        with open(os.path.join(path, name), "w") as f:
            f.write(value)


def rm_cgroups(base: str, pids: list[int]) -> list[int]:
    """rmdir the reaped units' cgroups; returns those still busy (retried later). What is left in
    a reaped unit's cgroup outlived its unit (rlimits mode: a process that left the process group)
    and is SIGKILLed."""
    import signal

    busy = []
    for pid in pids:
        path = os.path.join(base, f"u{pid}")
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError:
            busy.append(pid)
            try:
                with open(os.path.join(path, "cgroup.procs")) as f:
                    left = [int(p) for p in f.read().split()]
            except (OSError, ValueError):
                left = []
            for p in left:
                with contextlib.suppress(OSError):
                    os.kill(p, signal.SIGKILL)
    return busy


def pids_cgroup_base() -> str | None:
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
