"""Namespaces and the view of the filesystem a sandbox unit gets, before any job arrives.

Stdlib only: loaded by file path into the zygote (`zygote.py`), never through the package.
"""

from __future__ import annotations

import os
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
PR_SET_NO_NEW_PRIVS = 38
HIDE_PATHS = ("/root", "/home", "/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/var/lib/sss", "/run/secrets")
"""Covered inside the namespaces (the runner keeps the server's uid, so it could read them)."""


def load_libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def check(ret: int, what: str) -> None:
    if ret != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def write_file(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def enter_namespaces(cfg: dict[str, Any]) -> None:
    import ctypes

    libc = load_libc()
    uid, gid = os.geteuid(), os.getegid()
    check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC), "unshare")
    write_file("/proc/self/setgroups", "deny")
    write_file("/proc/self/uid_map", f"0 {uid} 1")
    write_file("/proc/self/gid_map", f"0 {gid} 1")
    check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")

    class MountAttr(ctypes.Structure):
        _fields_ = [
            ("attr_set", ctypes.c_uint64),
            ("attr_clr", ctypes.c_uint64),
            ("propagation", ctypes.c_uint64),
            ("userns_fd", ctypes.c_uint64),
        ]

    attr = MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    check(
        libc.syscall(
            SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)
        ),
        "mount_setattr(ro)",
    )
    size = f"size={int(cfg['tmpfs_mb'])}m,mode=1777".encode()
    check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, size), "mount tmpfs /tmp")
    _hide(libc, cfg.get("hide_paths", []), cfg.get("keep_paths", []))


def _hide(libc: Any, hide: list[str], keep: list[str]) -> None:
    """Cover `hide` (home directories, /etc/shadow, ...) with empty tmpfs / /dev/null, then bind
    back the `keep` paths inside them (the interpreter's prefix and site-packages)."""
    staged = []
    for i, path in enumerate(keep):
        if os.path.isdir(path) and any(path == h or path.startswith(h.rstrip("/") + "/") for h in hide):
            stage = f"/tmp/.keep{i}"
            os.mkdir(stage)
            check(libc.mount(path.encode(), stage.encode(), None, MS_BIND | MS_REC, None), f"bind {path}")
            staged.append((stage, path))
    for path in hide:
        if os.path.isdir(path) and not os.path.islink(path):
            check(
                libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,mode=755"), path
            )
        elif os.path.isfile(path):
            check(libc.mount(b"/dev/null", path.encode(), None, MS_BIND, None), f"hide {path}")
    for stage, path in staged:
        os.makedirs(path, exist_ok=True)
        check(libc.mount(stage.encode(), path.encode(), None, MS_BIND | MS_REC, None), f"rebind {path}")
        check(libc.umount2(stage.encode(), MNT_DETACH), f"umount {stage}")
        os.rmdir(stage)
    if staged:  # the re-created path components and the covering tmpfs stay read-only
        for path in hide:
            if os.path.isdir(path) and not os.path.islink(path):
                libc.mount(None, path.encode(), None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)


def drop_capabilities() -> None:
    import ctypes

    libc = load_libc()

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
    check(libc.capset(ctypes.byref(hdr), ctypes.byref(data)), "capset")
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(no_new_privs)")


def mount_proc() -> None:
    """A /proc of the new PID namespace (called by its PID 1): the host's processes are not visible."""
    check(load_libc().mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | 8, None), "mount /proc")
