"""The harness: what runs in the program's own process, around the program.

- `stdin` job: run the program as `__main__` and record how it ended (its stdout is compared
  outside);
- `calls` job (assert-style tests, the default): run the program, then answer the trusted
  evaluator's calls on fd 4 (`serve_calls`): each call names a function and carries plain-data
  arguments; the answer is the value, or the exception's builtin type and message, as plain data
  (`plain.py`). The tests are never here: nothing of them but the arguments of each call;
- `inside` job (only with the option `unsafe_run_inside`, and on SandboxFusion): the tests'
  statements run here after the program, `["setup", src]` and `["run", k, src]` — a case passes if
  it completes. FORGEABLE: the program shares this interpreter with the tests.

Records (events, how a stdin run or an inside case ended) go out through `emit`, one line each,
as `<nonce> <json>`. Exiting in any way ends the run.

Stdlib only, and self-contained: loaded by file path into the zygote (`zygote.py`), and sent as
source, with `fusion_main`, to SandboxFusion (`fusion.py`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any

EXIT_SETUP_FAILED = 125
CALL_FD = 4
MAX_FRAME = 1 << 23
plain: Any = None  # plain.py, set by the zygote (the `calls` mode only)

# bound before any program runs: rebinding the builtins later does not change what the harness uses
_type, _len, _isinstance, _callable, _str = type, len, isinstance, callable, str
_dumps, _loads, _write, _read, _exit = json.dumps, json.loads, os.write, os.read, os._exit
_ModuleType = type(os)
_MUTABLE = (list, dict, set, bytearray)
_BaseException, _Exception, _SystemExit, _MemoryError, _OSError = (
    BaseException,
    Exception,
    SystemExit,
    MemoryError,
    OSError,
)


def _failed(exc: BaseException, emit: Any) -> str:
    """An exception's name; a resource limit behind it is recorded as an event first: a
    MemoryError (RLIMIT_AS), EFBIG (RLIMIT_FSIZE) or ENOSPC (the private /tmp is full)."""
    if _isinstance(exc, _MemoryError):
        emit({"event": "memory"})
    elif _isinstance(exc, _OSError) and exc.errno in (27, 28):
        emit({"event": "file_limit"})
    return _type(exc).__name__


def _run(source: str, namespace: dict[str, Any], filename: str, emit: Any) -> str | None:
    """Execute; None when it ran to the end, else the exception's name. Exits propagate."""
    try:
        exec(compile(source, filename, "exec"), namespace)
    except _Exception as exc:
        return _failed(exc, emit)
    return None


def run_job(job: dict[str, Any], emit: Any) -> None:
    """Run one job; every outcome is a record through `emit(dict)`. Returns normally only when
    the job ran to its end; an exit of any kind propagates (the caller ends the process)."""
    import builtins

    if job["mode"] == "stdin":
        ns: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        try:
            err = _run(job["code"], ns, "<solution>", emit)
        except _SystemExit as exc:
            err = None if exc.code in (None, 0) else f"SystemExit({exc.code!r})"[:80]
        emit({"done": True, "error": err})
        return
    if job["mode"] == "calls":
        serve_calls(job, emit)
        return
    ns = {"__name__": "solution", "__builtins__": builtins}
    err = _run(job["code"], ns, "<solution>", emit)
    if err is not None:
        emit({"program_error": err})
        return
    for step in job["steps"]:
        if step[0] == "setup":
            err = _run(step[1], ns, "<tests>", emit)
            if err is not None:
                emit({"tests_error": err})
                return
        else:
            err = _run(step[2], ns, "<tests>", emit)
            emit({"i": step[1], "ok": True} if err is None else {"i": step[1], "raised": err})


class _Calls:
    """The program's side of the boundary: its namespace, the objects it keeps behind references,
    and the frames on the call socket."""

    def __init__(self, ns: dict[str, Any], emit: Any) -> None:
        self.ns, self.emit, self.refs = ns, emit, {}

    def keep(self, obj: Any) -> dict[str, int]:
        ref = _len(self.refs) + 1
        self.refs[ref] = obj
        return {"ref": ref}

    def out(self, value: Any) -> Any:
        """A value as plain data; what is not plain stays here behind a reference (a value too
        large or too deep stays whole)."""
        try:
            return plain.encode(value, self.keep)
        except plain.Unencodable:
            return self.keep(value)

    def arg(self, tag: str, body: Any) -> Any:
        """A reference the evaluator sends back: an object kept here (with an attribute path:
        `[ref, "left", ...]`), or one of the program's functions by name."""
        if tag == "fn":
            return self.ns[body]
        if _type(body) is list:
            obj = self.refs[body[0]]
            for name in body[1:]:
                obj = getattr(obj, name)
            return obj
        return self.refs[body]

    def describe(self, name: str) -> Any:
        if name not in self.ns:
            return None
        v = self.ns[name]
        if _type(v) is _ModuleType and _type(v.__name__) is str:
            return {"k": "mod", "m": v.__name__}
        if _callable(v):
            return {"k": "fn"}
        return {"k": "val", "v": self.out(v)}

    def answer(self, msg: dict[str, Any]) -> dict[str, Any]:
        op = msg.get("op")
        if op == "names":
            return {"names": {n: d for n in msg["names"] if (d := self.describe(n)) is not None}}
        try:
            if op == "setattr":
                setattr(self.arg("ref", msg["r"]), msg["n"], plain.decode(msg["v"], self.arg))
                return {}
            fn = self.ns[msg["f"]] if "f" in msg else self.refs[msg["r"]]
            args = [plain.decode(a, self.arg) for a in msg["a"]]
            kwargs = {k: plain.decode(v, self.arg) for k, v in msg["k"].items()}
            value = fn(*args, **kwargs)
        except _Exception as exc:
            return {"x": _builtin_base(exc, self.emit), "msg": _message(exc)}
        mutated = [[i, self.out(a)] for i, a in enumerate(args) if _type(a) in _MUTABLE]
        return {"v": self.out(value), "m": mutated}


def _builtin_base(exc: BaseException, emit: Any) -> str:
    """The name of the first builtin exception class the exception's class derives from."""
    name = _failed(exc, emit)
    import builtins

    for cls in _type(exc).__mro__:
        if getattr(builtins, cls.__name__, None) is cls:
            return cls.__name__
    return name


def _message(exc: BaseException) -> str:
    try:
        return _str(exc)[:2000]
    except _Exception:
        return ""


def _read_exact(n: int) -> bytes:
    buf = b""
    while _len(buf) < n:
        chunk = _read(CALL_FD, n - _len(buf))
        if not chunk:
            return b""
        buf += chunk
    return buf


def serve_calls(job: dict[str, Any], emit: Any) -> None:
    """Run the program, then answer the evaluator until it closes the call socket."""
    import builtins

    ns: dict[str, Any] = {"__name__": "solution", "__builtins__": builtins}
    err = _run(job["code"], ns, "<solution>", emit)
    calls = _Calls(ns, emit)
    while True:
        head = _read_exact(4)
        if not head:
            return
        n = int.from_bytes(head, "big")
        if n > MAX_FRAME:
            return
        msg = _loads(_read_exact(n))
        if msg.get("op") == "names" and err is not None:
            reply: dict[str, Any] = {"error": err}
        else:
            reply = calls.answer(msg)
        try:
            data = plain.dumps(reply)
        except (ValueError, TypeError, RecursionError):
            data = plain.dumps({"x": "ValueError", "msg": "the value does not encode"})
        _write_all(CALL_FD, len(data).to_bytes(4, "big") + data)


def _record(nonce: bytes, rec: dict[str, Any]) -> bytes:
    return nonce + b" " + _dumps(rec).encode() + b"\n"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[_write(fd, view) :]


def _guarded(job: dict[str, Any], emit: Any) -> None:
    """`run_job`, with a MemoryError raised outside the program's own code (encoding a value,
    the harness's bookkeeping) recorded as well."""
    try:
        run_job(job, emit)
    except _MemoryError:
        emit({"event": "memory"})


def child_main(cfg: dict[str, Any], job_sock: Any, record_fd: int, call_fd: int, set_rlimits: Any) -> None:
    """The program's process (the unit's child): wait for the job's descriptors and the record
    nonce, set the limits, run, exit. Never returns."""
    import io
    import socket

    msg, fds, _, _ = socket.recv_fds(job_sock, 256, 2)
    if len(fds) != 2:
        _exit(0)  # the zygote is going away
    nonce, (job_r, out_w) = msg, fds
    job_sock.close()
    chunks = []
    while chunk := os.read(job_r, 1 << 20):
        chunks.append(chunk)
    job = json.loads(b"".join(chunks))
    os.close(job_r)
    stdin_fd = os.memfd_create("stdin")
    _write_all(stdin_fd, job.get("stdin", "").encode())
    os.lseek(stdin_fd, 0, os.SEEK_SET)
    devnull = os.open(os.devnull, os.O_WRONLY)
    keep = (stdin_fd, out_w, devnull, record_fd) + ((call_fd,) if job["mode"] == "calls" else ())
    high = [os.dup(fd) for fd in keep]
    for target, fd in enumerate(high):
        os.dup2(fd, target)
    os.closerange(len(keep), 1 << 16)
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=False)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False))

    def emit(rec: dict[str, Any]) -> None:
        _write_all(3, _record(nonce, rec))

    try:
        set_rlimits(cfg)
    except _Exception as exc:
        emit({"event": "setup_failed", "message": f"rlimits: {exc}"})
        _exit(EXIT_SETUP_FAILED)
    try:
        _guarded(job, emit)
        sys.stdout.flush()
    except _BaseException:  # an exit the program raised past the harness: not a clean end
        _exit(1)
    _exit(0)


def fusion_main(job: dict[str, Any], nonce: str) -> None:
    """SandboxFusion's entry (the whole script is this file's source and a call to this): the
    same run, records on stdout between newlines (the only channel SandboxFusion returns)."""

    def emit(rec: dict[str, Any]) -> None:
        with contextlib.suppress(_BaseException):
            sys.stdout.flush()
        _write_all(1, b"\n" + _record(nonce.encode(), rec))

    try:
        _guarded(job, emit)
    finally:
        with contextlib.suppress(_BaseException):
            sys.stdout.flush()
