"""Gateway ↔ worker wire protocol: length-prefixed frames over a Unix socket.

A frame is `>II` (header length, body length), a UTF-8 JSON header, then raw body bytes.
Items are the HTTP API's items (`rewardplane.serve.protocol.item_fields`: every field the
service accepts reaches the worker's scorers), except that images travel in the body as bytes
with `[offset, length]` references in the header, so nothing is base64-inflated and nothing
is unpickled: a worker that is compromised or confused can at worst send bad JSON, which is a
clean `protocol` error. Results are one `{"score"}` or `{"error": {"code", "message"}}` per item.

Requests carry an integer `id`; one connection multiplexes any number of concurrent
requests, answered in completion order. If the connection drops, every request still in
flight fails with `worker_lost` — the caller can never mistake a dead worker for a score.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from rewardplane.core.errors import RewardplaneError
from rewardplane.serve.batcher import ItemResult, check_value
from rewardplane.serve.protocol import (
    DetailedScore,
    ItemError,
    ScoreItem,
    error_body,
    item_fields,
    item_from_fields,
)

log = logging.getLogger(__name__)

_PREFIX = struct.Struct(">II")
MAX_HEADER_BYTES = 16 * 1024 * 1024
MAX_BODY_BYTES = 512 * 1024 * 1024


class TransportError(RewardplaneError):
    code = "protocol"


class WorkerLost(RewardplaneError):
    """The worker process or its connection went away while a request was in flight."""

    code = "worker_lost"


class RemoteError(RewardplaneError):
    """The worker answered with an error (its `code` is kept)."""

    code = "worker_error"
    retry_after: float | None = None
    """Seconds the worker suggested waiting (its `queue_full`), relayed as `Retry-After`."""


def encode_frame(header: dict[str, Any], body: bytes = b"") -> bytes:
    head = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    if len(head) > MAX_HEADER_BYTES or len(body) > MAX_BODY_BYTES:
        raise TransportError(f"frame too large: header {len(head)} B, body {len(body)} B")
    return _PREFIX.pack(len(head), len(body)) + head + body


async def read_frame(reader: asyncio.StreamReader) -> tuple[dict[str, Any], bytes] | None:
    """Read one frame; None on a clean EOF between frames."""
    try:
        prefix = await reader.readexactly(_PREFIX.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise TransportError("connection closed inside a frame prefix") from exc
    head_len, body_len = _PREFIX.unpack(prefix)
    if head_len > MAX_HEADER_BYTES or body_len > MAX_BODY_BYTES:
        raise TransportError(f"frame too large: header {head_len} B, body {body_len} B")
    try:
        head = await reader.readexactly(head_len)
        body = await reader.readexactly(body_len) if body_len else b""
    except asyncio.IncompleteReadError as exc:
        raise TransportError("connection closed inside a frame") from exc
    try:
        header = json.loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TransportError(f"frame header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise TransportError("frame header must be a JSON object")
    return header, body


def encode_items(items: list[ScoreItem]) -> tuple[list[dict[str, Any]], bytes]:
    """Items as JSON-able dicts plus one body holding every image back to back."""
    out, chunks, offset = [], [], 0
    for item in items:
        ref = None
        if item.image is not None:
            ref = [offset, len(item.image)]
            chunks.append(item.image)
            offset += len(item.image)
        out.append({**item_fields(item), "image": ref})
    return out, b"".join(chunks)


def decode_items(raw: Any, body: bytes) -> list[ScoreItem]:
    if not isinstance(raw, list):
        raise TransportError("items must be a list")
    items = []
    for entry in raw:
        if not isinstance(entry, dict):
            raise TransportError("each item must be an object")
        ref = entry.get("image")
        image = None
        if ref is not None:
            if (
                not isinstance(ref, list)
                or len(ref) != 2
                or not all(isinstance(v, int) and v >= 0 for v in ref)
                or ref[0] + ref[1] > len(body)
            ):
                raise TransportError(f"item {entry.get('id')!r}: bad image reference {ref!r}")
            image = body[ref[0] : ref[0] + ref[1]]
        items.append(item_from_fields(entry, image))
    return items


def encode_results(results: list[Any]) -> list[dict[str, Any]]:
    """`ItemResult`s as wire dicts. A non-finite float never leaves the worker as a score."""
    out: list[dict[str, Any]] = []
    for r in map(check_value, results):
        if isinstance(r, DetailedScore):
            out.append({"score": float(r), "detail": r.detail})
        elif isinstance(r, float):
            out.append({"score": r})
        else:
            out.append({"error": error_body(r.code, r.message)})
    return out


def decode_results(raw: Any, n: int) -> list[ItemResult]:
    """Wire results → ItemResults, re-checking finiteness: a worker bug must not become a reward."""
    if not isinstance(raw, list) or len(raw) != n:
        got = len(raw) if isinstance(raw, list) else type(raw).__name__
        return [ItemError("scorer_failed", f"worker returned {got} results for {n} items")] * n
    out: list[ItemResult] = []
    for r in raw:
        if isinstance(r, dict) and "score" in r:
            detail = r.get("detail")
            value = r["score"]
            if isinstance(detail, dict) and detail and isinstance(value, int | float):
                value = DetailedScore(value, detail)
            out.append(check_value(value))
        elif isinstance(r, dict) and isinstance(r.get("error"), dict):
            err = r["error"]
            out.append(ItemError(str(err.get("code", "scorer_failed")), str(err.get("message", ""))))
        else:
            out.append(ItemError("scorer_failed", f"worker returned {r!r}"))
    return out


class TransportClient:
    """One multiplexed connection to a worker. Safe for many concurrent `call`s on one loop."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[tuple[dict[str, Any], bytes]]] = {}
        self._closed: RewardplaneError | None = None
        self._reader_task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def connect(cls, path: str) -> TransportClient:
        reader, writer = await asyncio.open_unix_connection(path, limit=2**20)
        return cls(reader, writer)

    @property
    def closed(self) -> bool:
        return self._closed is not None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def call(
        self, op: str, payload: dict[str, Any] | None = None, body: bytes = b"", timeout: float | None = None
    ) -> tuple[dict[str, Any], bytes]:
        """Send one request and wait for its answer; raises WorkerLost, RemoteError or TimeoutError."""
        if self._closed is not None:
            raise WorkerLost(f"connection closed: {self._closed.message}")
        rid = next(self._ids)
        fut: asyncio.Future[tuple[dict[str, Any], bytes]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            self._writer.write(encode_frame({**(payload or {}), "id": rid, "op": op}, body))
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            self._pending.pop(rid, None)
            self._fail_all(WorkerLost(f"write to worker failed: {exc}"))
            raise WorkerLost(f"write to worker failed: {exc}") from exc
        try:
            header, rbody = await asyncio.wait_for(fut, timeout)
        finally:
            self._pending.pop(rid, None)
        if not header.get("ok", False):
            err = header.get("error") or {}
            remote = RemoteError(
                str(err.get("message", "worker error")), code=str(err.get("code", "worker_error"))
            )
            retry_after = err.get("retry_after")
            if isinstance(retry_after, int | float) and not isinstance(retry_after, bool):
                remote.retry_after = float(retry_after)
            raise remote
        return header, rbody

    async def _read_loop(self) -> None:
        reason: RewardplaneError = WorkerLost("worker closed the connection")
        try:
            while True:
                frame = await read_frame(self._reader)
                if frame is None:
                    break
                header, body = frame
                fut = self._pending.get(header.get("id"))  # type: ignore[arg-type]
                if fut is not None and not fut.done():
                    fut.set_result((header, body))
        except TransportError as exc:
            reason = WorkerLost(f"worker sent a malformed frame: {exc.message}")
        except (ConnectionError, OSError) as exc:
            reason = WorkerLost(f"connection to worker lost: {exc}")
        self._fail_all(reason)

    def _fail_all(self, reason: RewardplaneError) -> None:
        if self._closed is None:
            self._closed = reason
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(WorkerLost(reason.message))
        self._pending.clear()
        self._writer.close()

    def abort(self, message: str) -> None:
        """Fail every call in flight now with `WorkerLost(message)` and close: a worker that
        stopped answering (no heartbeat) must not keep its items waiting for their timeout."""
        self._fail_all(WorkerLost(message))

    async def close(self) -> None:
        self._fail_all(WorkerLost("connection closed by the gateway"))
        self._reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader_task
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()


Handler = Callable[[str, dict[str, Any], bytes], Awaitable[tuple[dict[str, Any], bytes]]]


async def serve_unix(path: str, handler: Handler) -> asyncio.AbstractServer:
    """Serve `handler(op, header, body) -> (result_header, result_body)` on a 0600 Unix socket.

    Each request runs as its own task so a slow scorer never blocks another's answer.
    Handler exceptions become error frames carrying the exception's stable `code`.
    """

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks: set[asyncio.Task[None]] = set()

        async def run_one(header: dict[str, Any], body: bytes) -> None:
            rid = header.get("id")
            try:
                result, rbody = await handler(str(header.get("op")), header, body)
                frame = encode_frame({**result, "id": rid, "ok": True}, rbody)
            except Exception as exc:
                code = exc.code if isinstance(exc, RewardplaneError) else "internal"
                if not isinstance(exc, RewardplaneError):
                    log.exception("worker request %s failed", rid)
                error = {"code": code, "message": str(exc)}
                if (retry_after := getattr(exc, "retry_after", None)) is not None:
                    error["retry_after"] = retry_after  # queue_full's Retry-After reaches the client
                frame = encode_frame({"id": rid, "ok": False, "error": error})
            with contextlib.suppress(ConnectionError, OSError):
                writer.write(frame)
                await writer.drain()

        try:
            while True:
                frame = await read_frame(reader)
                if frame is None:
                    break
                task = asyncio.get_running_loop().create_task(run_one(*frame))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        except (TransportError, ConnectionError, OSError) as exc:
            log.warning("dropping gateway connection: %s", exc)
        except asyncio.CancelledError:
            pass  # server shutting down: end this connection quietly
        finally:
            for task in tasks:
                task.cancel()
            writer.close()

    old_umask = os.umask(0o177)
    try:
        server = await asyncio.start_unix_server(on_connection, path=path, limit=2**20)
    finally:
        os.umask(old_umask)
    return server
