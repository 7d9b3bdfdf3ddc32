"""The namespaces and the minimal root a sandboxed program sees, built before any job arrives.

`plan()` runs in the server and lists what the root holds; `enter_namespaces()` (the unit) and
`build_root()` (the program's process, PID 1 of the new PID namespace) run in the zygote's forks. The root is
a fresh tmpfs holding, read-only and at the same paths as on the host:

- the system's shared libraries and tools (`/usr`, and `/bin`, `/lib`, ... or their symlinks),
- the interpreter's prefix (its binary, standard library and `lib-dynload`), with every
  site-packages directory inside a bound tree covered by an empty tmpfs,
- the site-packages entries of the packages the scorer allows (`packages:`, with their
  dependencies), bound one by one,
- `/etc/ld.so.cache`, `/etc/ld.so.conf(.d)`, `/etc/localtime` and a two-line `/etc/passwd` and
  `/etc/group` written for the sandbox's uid,
- `/dev/null`, `/dev/zero`, `/dev/urandom` (bound from the host's) and the `/dev/fd`, `/dev/std*`,
  `/dev/shm` symlinks,

plus a private size-capped tmpfs on `/tmp` (the working directory and `HOME`) and a `/proc` of
the program's own PID namespace. Then `pivot_root` into it and detach the host's tree: the server's
working directory, its config, model directories, the repository, the virtual environment's other
packages, home directories and the rest of `/etc` are not in the mount namespace at all.

Stdlib only: loaded by file path into the zygote (`zygote.py`); the server imports `plan` and
`HOST_SITE_DIRS` through the package.
"""

from __future__ import annotations

import os
import sys
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
SYS_MOUNT_SETATTR = 442  # x86_64 and aarch64 share this number
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime")
NEW_ROOT = "/tmp"
"""Where the new root is assembled (in the unit's own mount namespace, over the host's /tmp;
sources under it are bound through descriptors opened before it is covered)."""


# ----------------------------------------------------------------------------- server side: the plan


def _outermost(paths: list[str]) -> list[str]:
    """Only the outermost of nested paths: binding a parent brings its children."""
    out = sorted(set(paths))
    return [p for p in out if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in out)]


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def interpreter_dirs() -> list[str]:
    """The running interpreter's prefixes, binary directory and standard library (real paths)."""
    import sysconfig

    paths = {sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    for key in ("stdlib", "platstdlib"):
        stdlib = sysconfig.get_path(key, vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})
        if stdlib:
            paths.add(stdlib)
    dynload = sysconfig.get_config_var("DESTSHARED")
    if dynload:
        paths.add(dynload)
    paths.add(os.path.dirname(os.__file__))  # where `os` really came from
    return [os.path.realpath(p) for p in paths if p and os.path.isdir(p)]


def _site_dirs_to_cover(bound: list[str], stdlib: list[str]) -> list[str]:
    """Every package directory inside a bound tree: the system's and the base interpreter's
    site-/dist-packages and whatever else this server has on `sys.path` there (never a standard
    library directory, nor one that holds it)."""
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = {p for p in sys.path if p}
    for prefix in {"/usr", "/usr/local", sys.base_prefix, sys.base_exec_prefix}:
        for sub in ("lib/python3/dist-packages", f"lib/{ver}/dist-packages", f"lib/{ver}/site-packages"):
            candidates.add(os.path.join(prefix, sub))
        candidates.add(os.path.join(prefix, f"lib64/{ver}/site-packages"))
        candidates.add(os.path.join(prefix, f"local/lib/{ver}/dist-packages"))
    out = []
    for c in candidates:
        real = os.path.realpath(c)
        if os.path.isdir(real) and _under(real, bound) and not any(_under(s, [real]) for s in stdlib):
            out.append(real)
    return _outermost(out)


def plan(packages: list[tuple[str, str]] = ()) -> dict[str, Any]:
    """What `build_root` mounts: {"binds", "links", "covers", "sys_path"}. `packages` are
    (site-packages directory, entry name) pairs (`package_entries`), bound at their own paths."""
    links = {d: os.readlink(d) for d in SYSTEM_DIRS if os.path.islink(d)}
    interp = interpreter_dirs()
    system = [d for d in SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    binds = _outermost([*system, *interp])
    stdlib = [p for p in interp if p not in (sys.base_prefix, sys.base_exec_prefix)]
    covers = _site_dirs_to_cover(binds, stdlib)
    pkg_paths = sorted({os.path.join(site, entry) for site, entry in packages})
    return {
        "binds": binds + [p for p in ETC_FILES if os.path.exists(p)],
        "links": links,
        "covers": covers,
        "packages": pkg_paths,
        "sys_path": sorted({site for site, _ in packages}),
    }


def package_entries(names: list[str]) -> list[tuple[str, str]]:
    """(site-packages dir, top-level entry) for each allowed import name, its distribution's files
    and its dependencies' (the requirements that apply without extras), recursively. An unknown
    name raises LookupError."""
    import importlib.metadata as md

    try:
        from packaging.requirements import Requirement
    except ImportError:  # pragma: no cover - packaging comes with transformers
        Requirement = None
    by_module = md.packages_distributions()
    todo, seen, out = [], set(), set()
    for name in names:
        dists = by_module.get(name)
        if not dists:
            raise LookupError(f"package {name!r} is not installed in this environment")
        todo += dists
    while todo:
        dist_name = todo.pop()
        key = dist_name.lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = md.distribution(dist_name)
        except md.PackageNotFoundError:
            continue  # an optional dependency that is not installed
        site = os.path.realpath(str(dist.locate_file("")))
        for f in dist.files or ():
            if f.parts and f.parts[0] != ".." and not f.parts[0].endswith(".pth"):
                out.add((site, f.parts[0]))
        for req in dist.requires or ():
            if Requirement is None:
                break
            r = Requirement(req)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r.name)
    return sorted(out)


# ----------------------------------------------------------------------------- in the zygote's forks


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


def enter_namespaces() -> None:
    """The unit: new user, mount, network, PID and IPC namespaces, this uid/gid as 0 inside, every
    mount private. Its next child is PID 1 of the new PID namespace."""
    libc = load_libc()
    uid, gid = os.geteuid(), os.getegid()
    check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC), "unshare")
    write_file("/proc/self/setgroups", "deny")
    write_file("/proc/self/uid_map", f"0 {uid} 1")
    write_file("/proc/self/gid_map", f"0 {gid} 1")
    check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")


def _mkpath(path: str, is_dir: bool) -> None:
    if is_dir:
        os.makedirs(path, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.exists(path):
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


def _bind_all(libc: Any, sources: list[str], fds: dict[str, int]) -> None:
    """Bind each host path at the same path under NEW_ROOT, through its descriptor in `fds`,
    opened before NEW_ROOT covered the host's /tmp (a checkout or a venv may live there)."""
    for src in sources:
        via = f"/proc/self/fd/{fds[src]}"
        _mkpath(NEW_ROOT + src, os.path.isdir(via))
        check(
            libc.mount(via.encode(), (NEW_ROOT + src).encode(), None, MS_BIND | MS_REC, None),
            f"bind {src}",
        )


def _assemble(libc: Any, root: dict[str, Any], fds: dict[str, int], *, under_tmp: bool) -> list[str]:
    """The binds, covers and allowed packages of the plan that lie under /tmp (`under_tmp`) or
    not: the first kind go on the private /tmp once it is mounted, the rest before. Returns the
    mount points made, for the caller to make read-only."""

    def pick(paths: list[str]) -> list[str]:
        return [p for p in paths if _under(p, ["/tmp"]) == under_tmp]

    binds, covers, packages = pick(root["binds"]), pick(root["covers"]), pick(root["packages"])
    _bind_all(libc, binds, fds)
    for path in covers:
        _mkpath(NEW_ROOT + path, True)
        check(
            libc.mount(
                b"tmpfs", (NEW_ROOT + path).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=4k,mode=755"
            ),
            path,
        )
    _bind_all(libc, packages, fds)  # allowed entries, also inside a covered directory
    return [NEW_ROOT + p for p in (*binds, *covers, *packages)]


def _readonly(libc: Any, path: str) -> None:
    """Every mount at and under `path` read-only (mount_setattr), without touching the flags the
    kernel locks on mounts inherited from the host (a plain read-only remount fails on those)."""
    import ctypes

    class MountAttr(ctypes.Structure):
        _fields_ = [
            ("attr_set", ctypes.c_uint64),
            ("attr_clr", ctypes.c_uint64),
            ("propagation", ctypes.c_uint64),
            ("userns_fd", ctypes.c_uint64),
        ]

    attr = MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    ret = libc.syscall(
        SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)
    )
    check(ret, f"mount_setattr(ro) {path}")


def build_root(cfg: dict[str, Any]) -> None:
    """In the program's process (PID 1 of the new PID namespace, with every capability inside
    the user namespace until `drop_privileges`): assemble the root under NEW_ROOT, then pivot
    into it and detach the host's tree."""
    import platform

    libc = load_libc()
    root, new = cfg["root"], NEW_ROOT
    # every source is opened before the new root covers the host's /tmp (one may live there)
    fds = {src: os.open(src, os.O_PATH) for src in {*root["binds"], *root["packages"]}}
    check(
        libc.mount(b"tmpfs", new.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,mode=755"), "root tmpfs"
    )
    _assemble(libc, root, fds, under_tmp=False)
    for path, target in root["links"].items():
        os.symlink(target, new + path)
    os.makedirs(new + "/dev", exist_ok=True)
    for name in ("null", "zero", "urandom"):
        _mkpath(f"{new}/dev/{name}", False)
        check(libc.mount(f"/dev/{name}".encode(), f"{new}/dev/{name}".encode(), None, MS_BIND, None), name)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
    ):
        os.symlink(target, f"{new}/dev/{name}")
    os.symlink("/proc/self/fd/2", f"{new}/dev/stderr")
    os.symlink("/tmp", f"{new}/dev/shm")
    os.makedirs(new + "/etc", exist_ok=True)
    with open(new + "/etc/passwd", "w") as f:
        f.write("sandbox:x:0:0:sandbox:/tmp/home:/bin/sh\n")
    with open(new + "/etc/group", "w") as f:
        f.write("sandbox:x:0:\n")
    os.mkdir(new + "/tmp")
    os.mkdir(new + "/proc")
    _readonly(libc, new)
    size = f"size={int(cfg['tmpfs_mb'])}m,mode=1777".encode()
    check(libc.mount(b"tmpfs", (new + "/tmp").encode(), b"tmpfs", MS_NOSUID | MS_NODEV, size), "tmpfs /tmp")
    # what lives under the host's /tmp (a checkout's venv, an interpreter) goes on the private
    # /tmp at its own path, read-only like the rest; the tmpfs around it stays writable
    for mount_point in _assemble(libc, root, fds, under_tmp=True):
        _readonly(libc, mount_point)
    for fd in fds.values():
        os.close(fd)
    # a /proc of this PID namespace: the host's processes are not visible (mounted while the host's
    # /proc is still in the namespace, which the kernel requires of a user namespace)
    check(
        libc.mount(b"proc", (new + "/proc").encode(), b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "proc"
    )
    os.chdir(new)
    check(libc.syscall(SYS_PIVOT_ROOT[platform.machine()], b".", b"."), "pivot_root")
    check(libc.umount2(b".", MNT_DETACH), "detach the host's tree")
    os.chdir("/")


def drop_privileges() -> None:
    """No capabilities (in any namespace), no_new_privs (an exec cannot regain them)."""
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


def make_undumpable() -> None:
    """This process's memory, descriptors and /proc files are out of reach of processes without
    CAP_SYS_PTRACE (the program it starts has none): no ptrace, no /proc/<pid>/mem or environ."""
    check(load_libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(dumpable 0)")


def private_tmp(tmpfs_mb: int) -> None:
    """The evaluator (the unit, inside the program's user namespace and, since the program
    pivoted, its minimal root): a mount namespace of its own with a fresh tmpfs on /tmp, so
    nothing the program writes there is seen by the tests."""
    libc = load_libc()
    check(libc.unshare(CLONE_NEWNS), "unshare(mount)")
    size = f"size={int(tmpfs_mb)}m,mode=1777".encode()
    check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, size), "evaluator tmpfs /tmp")
    os.chdir("/tmp")
