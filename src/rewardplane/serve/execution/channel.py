"""The result channel: from the program's records to the server, through a part the program
cannot reach.

    program's process --records pipe--> unit --result pipe--> server
     `<nonce> <json>` lines              `<secret>\n<meta>\n<records>`

The unit forks the program's process before a job exists, so the program never holds what the
unit receives afterwards: the result pipe and the per-run secret (the zygote sends them on the
unit's own socket, which the program's process closed right after the fork). The unit is outside the program's PID namespace (the program has no pid to
signal, trace or read under /proc for it) and undumpable, and the program has no capabilities.
The unit keeps the lines of the records pipe that carry the program's nonce (a per-run value of
the harness: it only stops blind writes — a program that finds it in its own memory can emit
records, which are worth no more than returning those values) and frames what it keeps with the
secret. What the server accepts is what the unit wrote: how the program's process ended (exit
status or signal, from `waitpid`) and the records it sent before that.

Stdlib only: `relay` runs in the unit (loaded by file path into the zygote); the server imports
`read_report` through the package.
"""

from __future__ import annotations

import json
import os
import selectors
from typing import Any

MAX_RECORD_BYTES = 8 << 20
"""Records beyond this many bytes in one run are dropped (`truncated`); their cases fail."""


def relay(secret: bytes, nonce: bytes, records_fd: int, pid: int, res_fd: int, meta: dict[str, Any]) -> int:
    """In the unit: collect the records of process `pid` until it exits, then write the framed
    report to `res_fd`. Returns the exit code to pass on (128 + signal for a signal)."""
    prefix = nonce + b" "
    kept: list[bytes] = []
    size, forged, truncated = 0, 0, False
    buf = bytearray()

    def take(final: bool) -> None:
        nonlocal size, forged, truncated
        lines = buf.split(b"\n")
        rest = b"" if final else lines.pop()
        for line in lines:
            if not line:
                continue
            if not line.startswith(prefix):
                forged += 1
            elif size + len(line) > MAX_RECORD_BYTES:
                truncated = True
            else:
                kept.append(line[len(prefix) :])
                size += len(line)
        buf[:] = rest

    pidfd = os.pidfd_open(pid)
    sel = selectors.DefaultSelector()
    sel.register(records_fd, selectors.EVENT_READ)
    sel.register(pidfd, selectors.EVENT_READ)
    exited = False
    while not exited:
        for key, _ in sel.select():
            if key.fd == pidfd:
                exited = True
                continue
            chunk = os.read(records_fd, 1 << 16)
            if not chunk:  # every writer closed: the process is ending
                sel.unregister(records_fd)
                continue
            buf.extend(chunk)
            take(False)
    sel.close()
    os.set_blocking(records_fd, False)
    try:  # what it wrote before it ended (its children may hold the pipe open: no EOF wait)
        while chunk := os.read(records_fd, 1 << 16):
            buf.extend(chunk)
    except BlockingIOError:
        pass
    take(True)
    _, status = os.waitpid(pid, 0)
    signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    code = os.WEXITSTATUS(status) if signum is None else None
    meta = {**meta, "exit": code, "signal": signum, "forged": forged, "truncated": truncated}
    body = secret + b"\n" + json.dumps(meta).encode() + b"\n" + b"\n".join(kept)
    view = memoryview(body)
    while view:
        view = view[os.write(res_fd, view) :]
    os.close(res_fd)
    return 128 + signum if signum is not None else code


def read_report(data: bytes, secret: bytes) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """In the server: (meta, records) from what the unit wrote, or None when it is not framed
    with this run's secret (the unit died before writing it). A record that does not parse as
    a JSON object is dropped (its case fails)."""
    if not data.startswith(secret + b"\n"):
        return None
    head, _, body = data[len(secret) + 1 :].partition(b"\n")
    try:
        meta = json.loads(head)
    except ValueError:
        return None
    records = []
    for line in body.split(b"\n") if body else ():
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(rec, dict):
            records.append(rec)
    return meta, records
