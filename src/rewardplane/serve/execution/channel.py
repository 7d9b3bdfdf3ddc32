"""The result channel: from the program's records to the server, through a part the program
cannot reach.

    program's process --records pipe--> zygote --result pipe--> server
     `<nonce> <json>` lines                `<secret>\n<meta>\n<records>`

The result pipe and the run's secret go from the server to the zygote and no further: no process
of the unit ever holds them. The zygote is outside the program's namespaces (in its PID namespace
the program has no pid to signal, trace or read under /proc for it), undumpable, and the program
has no capabilities. The zygote keeps the lines of the records pipe that carry the run's nonce (a
value the harness holds in the program's own process: it only stops blind writes — a program
that finds it in its own memory can emit records, which are worth no more than returning those
values), frames what it kept with the secret and adds how the program's process ended (its wait
status, passed on by the unit). The server accepts only a report framed with that run's secret. For assert-style tests the
cases are decided by the evaluator's verdict, which the unit sends on its own socket to the zygote
(the program holds no end of it) and the zygote puts in the report's meta; the program's records
then carry only events (a MemoryError, a file limit).

Stdlib only: `Records` is used by the zygote (loaded by file path); the server imports
`read_report` through the package.
"""

from __future__ import annotations

import json
from typing import Any

MAX_RECORD_BYTES = 8 << 20
"""Records beyond this many bytes in one run are dropped (`truncated`); their cases fail."""


class Records:
    """One run's records as the zygote reads them: nonce-prefixed lines kept (up to
    MAX_RECORD_BYTES), any other line counted (`forged`)."""

    def __init__(self, nonce: bytes) -> None:
        self.prefix = nonce + b" "
        self.kept: list[bytes] = []
        self.size, self.forged, self.truncated = 0, 0, False
        self.buf = bytearray()

    def feed(self, chunk: bytes) -> None:
        self.buf += chunk
        if len(self.buf) > MAX_RECORD_BYTES:  # one endless line
            self.buf.clear()
            self.truncated = True
        self._take(final=False)

    def finish(self) -> None:
        self._take(final=True)

    def _take(self, final: bool) -> None:
        lines = self.buf.split(b"\n")
        rest = b"" if final else lines.pop()
        for line in lines:
            if not line:
                continue
            if not line.startswith(self.prefix):
                self.forged += 1
            elif self.size + len(line) > MAX_RECORD_BYTES:
                self.truncated = True
            else:
                self.kept.append(line[len(self.prefix) :])
                self.size += len(line)
        self.buf[:] = rest

    def report(self, secret: bytes, meta: dict[str, Any]) -> bytes:
        meta = {**meta, "forged": self.forged, "truncated": self.truncated}
        return secret + b"\n" + json.dumps(meta).encode() + b"\n" + b"\n".join(self.kept)


def read_report(data: bytes, secret: bytes) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """In the server: (meta, records) from what the zygote wrote, or None when it is not framed
    with this run's secret (the unit was killed before it could pass on how its program ended). A record that does not parse as
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
