"""The harness: what runs in the program's own process, around the program.

For a stdin/stdout job it runs the program as `__main__` and records how it ended. For an
assert-style job it runs the program, then the test steps the scorer sent, in order:

- `["setup", src]`: an import, def, class or assignment of the tests, executed;
- `["expr", k, src]`: case k's EXPR (the left side of `assert EXPR == EXPECTED`, ...): evaluated,
  and the value sent back as canonical JSON (`encode`). EXPECTED never comes here: the scorer
  compares outside. A value that is not a builtin instance (a class with its own `__eq__`, a
  subclass of `int` or `str`, a generator, ...) cannot be encoded and fails its case;
- `["run", k, src]`: case k could not be split (a loop, a helper's asserts): executed as is; it
  passes if it completes.

Every record goes out through `emit`, one line each, as `<nonce> <json>`. Exiting in any way —
`sys.exit` with any code, `os._exit`, a signal, an exception that is not an `Exception` — ends the
run: a case passes only when its record was sent. What this process cannot prevent: the program
runs in the same interpreter, so it can reach the harness's memory (gc, frames, ctypes) and emit
records of its own for its cases. A forged value is worth what returning that value is worth (the
expected values are not here); a forged `ok` for an unsplittable case is a pass — those cases are
not defended against a targeted program (`unsplittable_tests: error` refuses them).

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
MAX_DEPTH = 64
MAX_VALUE_BYTES = 1 << 20
"""A value whose canonical JSON is larger fails its case (`unencodable`)."""

# bound before any program runs: rebinding the builtins later does not change what the harness uses
_type, _len, _sorted, _isinstance = type, len, sorted, isinstance
_INF = float("inf")
_dumps, _write, _exit = json.dumps, os.write, os._exit
_BaseException, _Exception, _SystemExit, _MemoryError, _OSError = (
    BaseException,
    Exception,
    SystemExit,
    MemoryError,
    OSError,
)


class Unencodable(Exception):
    pass


def encode(value: Any, depth: int = 0) -> Any:
    """A builtin value as canonical JSON data. Scalars (None, bool, int, str, finite float) are
    themselves; the rest are tagged: {"float": "nan"|"inf"|"-inf"}, {"tuple": [...]},
    {"dict": [[key, value], ...]}, {"set"|"frozenset": [...]} (sorted by the elements' JSON),
    {"bytes": hex}; lists are JSON arrays. Only exact builtin types: a subclass is refused."""
    if depth > MAX_DEPTH:
        raise Unencodable("nested too deeply")
    t = _type(value)
    if value is None or t is bool or t is int or t is str:
        return value
    if t is float:
        if value != value:  # an exact float: its own comparison, no program code
            return {"float": "nan"}
        if value == _INF or value == -_INF:
            return {"float": "inf" if value > 0 else "-inf"}
        return value
    if t is list:
        return [encode(v, depth + 1) for v in value]
    if t is tuple:
        return {"tuple": [encode(v, depth + 1) for v in value]}
    if t is dict:
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if t is set or t is frozenset:
        items = _sorted((encode(v, depth + 1) for v in value), key=lambda e: _dumps(e, sort_keys=True))
        return {"set" if t is set else "frozenset": items}
    if t is bytes:
        return {"bytes": value.hex()}
    raise Unencodable(f"{t.__module__}.{t.__qualname__}"[:80])


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
        elif step[0] == "run":
            err = _run(step[2], ns, "<tests>", emit)
            emit({"i": step[1], "ok": True} if err is None else {"i": step[1], "raised": err})
        else:
            try:
                value = eval(compile(step[2], "<tests>", "eval"), ns)
            except _Exception as exc:
                emit({"i": step[1], "raised": _failed(exc, emit)})
                continue
            try:
                data = _dumps(encode(value), allow_nan=False)
                if _len(data) > MAX_VALUE_BYTES:
                    raise Unencodable(f"over {MAX_VALUE_BYTES} bytes")
            except (Unencodable, ValueError, RecursionError, TypeError) as exc:
                emit({"i": step[1], "unencodable": str(exc)[:100]})
                continue
            emit({"i": step[1], "v": _Raw(data)})


class _Raw(str):
    """An already-encoded value, spliced into its record without encoding it twice."""


def _record(nonce: bytes, rec: dict[str, Any]) -> bytes:
    parts = [f"{_dumps(k)}: {v if _type(v) is _Raw else _dumps(v)}" for k, v in rec.items()]
    return nonce + b" {" + ", ".join(parts).encode() + b"}\n"


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


def child_main(cfg: dict[str, Any], job_sock: Any, record_fd: int, set_rlimits: Any) -> None:
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
    high = [os.dup(fd) for fd in (stdin_fd, out_w, devnull, record_fd)]
    for target, fd in enumerate(high):
        os.dup2(fd, target)
    os.closerange(4, 1 << 16)
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
