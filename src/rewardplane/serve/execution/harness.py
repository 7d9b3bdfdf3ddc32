"""The runner's harness, in the sandbox: wait for a job, run the code, report, exit.

Stdlib only: loaded by file path into the zygote (`zygote.py`); `split_tests` is also imported
by the code scorer.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from typing import Any

EXIT_SETUP_FAILED = 125


def read_all(fd: int) -> bytes:
    chunks = []
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def split_tests(tests: str) -> tuple[list[str], list[str]]:
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


def runner_main(cfg: dict[str, Any], unit_sock: socket.socket, set_rlimits: Any) -> None:
    """PID 1 of the sandbox: wait for a job, run it, report, exit. `set_rlimits(cfg)` (from
    `limits.py`) is applied once the job's descriptors are in place."""
    msg, fds, _, _ = socket.recv_fds(unit_sock, 64, 3)
    if not fds:
        os._exit(0)  # the zygote is going away
    job_r, out_w, res_w = fds
    job = json.loads(read_all(job_r))
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
        set_rlimits(cfg)
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
        setup, cases = split_tests(job["tests"])
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
