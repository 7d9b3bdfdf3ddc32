"""Clients for the reward service: `RewardClient` (sync) and `AsyncRewardClient` (asyncio).

Both reuse one HTTP connection pool, retry 429 / 503 / connection failures with exponential
backoff and jitter (a `Retry-After` from the server wins over the computed delay), and send one
`Idempotency-Key` per logical request, the same on every retry, so server logs can tie retries
together (scoring is side-effect free, so a retried request cannot double-count anything).

A failed item never comes back as a number: unless `allow_partial=True`, any per-item error
raises `ScoreError` listing every failed (item, scorer) with its code.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from rewardplane.core.errors import RewardplaneError
from rewardplane.serve.protocol import (
    HTTP_ERROR_CODE,
    IDEMPOTENCY_KEY_HEADER,
    LIFECYCLE_ROUTE,
    MULTIPART_REQUEST_PART,
    SCORE_ROUTE,
    SCORERS_ROUTE,
    encode_score_request,
    lifecycle_route,
)
from rewardplane.serve.scorers.base import ScoreItem

RETRY_STATUS = (429, 503)
RETRY_EXCEPTIONS = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.RemoteProtocolError,
    httpx.ReadError,
    httpx.WriteError,
    httpx.PoolTimeout,
)


@dataclass(frozen=True)
class ItemFailure:
    id: str
    scorer: str
    code: str
    message: str


@dataclass(frozen=True)
class ItemScores:
    id: str
    scores: dict[str, float]
    errors: dict[str, dict[str, str]] = field(default_factory=dict)
    details: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Scorer → what its score leaves unsaid for this item, e.g. `{"reward": {"left_out": ["rm"]}}`
    when a renormalising composite scored without a component; empty for most items."""


class ServiceError(RewardplaneError):
    """A whole-request error from the service (4xx/5xx with `{"code", "message"}`), after retries."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"HTTP {status} {code}: {message}", code=code)
        self.status = status


class ScoreError(RewardplaneError):
    """Some items failed; `failures` lists each (id, scorer, code), `results` holds everything."""

    code = "score_failed"

    def __init__(self, failures: list[ItemFailure], results: list[ItemScores]) -> None:
        # the reason with the code: "0/rm: bad_input: empty response (...)" (a trainer shows only this line)
        head = ", ".join(
            f"{f.id}/{f.scorer}: {f.code}" + (f": {f.message[:160]}" if f.message else "")
            for f in failures[:5]
        )
        more = f" (+{len(failures) - 5} more)" if len(failures) > 5 else ""
        super().__init__(f"{len(failures)} item score(s) failed: {head}{more}")
        self.failures = failures
        self.results = results


def score_request_kwargs(
    items: Iterable[ScoreItem | Mapping[str, Any]],
    scorers: list[str],
    pin: Mapping[str, str] | None,
    multipart: bool,
) -> dict[str, Any]:
    """httpx keyword arguments for one POST /v1/score (the body from `protocol.encode_score_request`)."""
    payload, parts = encode_score_request(items, scorers, pin, multipart=multipart)
    if not multipart:
        return {"content": json.dumps(payload), "headers": {"content-type": "application/json"}}
    files = [(name, (name, data, "application/octet-stream")) for name, data in parts.items()]
    return {"files": [(MULTIPART_REQUEST_PART, (None, json.dumps(payload), "application/json")), *files]}


def _parse(response: httpx.Response, allow_partial: bool) -> list[ItemScores]:
    if response.status_code != 200:
        try:
            body = response.json()
            code, message = str(body.get("code", HTTP_ERROR_CODE)), str(body.get("message", ""))
        except (ValueError, AttributeError):
            code, message = HTTP_ERROR_CODE, response.text[:200]
        raise ServiceError(response.status_code, code, message)
    results = [
        ItemScores(r["id"], r["scores"], r.get("errors") or {}, r.get("details") or {})
        for r in response.json()["results"]
    ]
    failures = [ItemFailure(r.id, s, e["code"], e["message"]) for r in results for s, e in r.errors.items()]
    if failures and not allow_partial:
        raise ScoreError(failures, results)
    return results


def _lifecycle_body(scorers: Sequence[str] | None, timeout_s: float | None) -> dict[str, Any]:
    """A `POST /v1/lifecycle/<action>` body: no scorers means every scorer of the server."""
    body: dict[str, Any] = {}
    if scorers is not None:
        body["scorers"] = [scorers] if isinstance(scorers, str) else list(scorers)
    if timeout_s is not None:
        body["timeout_s"] = float(timeout_s)
    return body


def _json(response: httpx.Response) -> dict[str, Any]:
    if response.status_code != 200:
        _parse(response, True)  # raises ServiceError with the body's code
    return response.json()


class _Base:
    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = 120.0,
        max_retries: int = 6,
        backoff_s: float = 0.25,
        max_backoff_s: float = 30.0,
        allow_partial: bool = False,
        multipart: bool = False,
    ) -> None:
        self.url = url.rstrip("/")
        token = token or os.environ.get("REWARDPLANE_TOKEN")
        self.headers = {"authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.allow_partial = allow_partial
        self.multipart = multipart

    def _prepare(self, items, scorers: list[str], pin: Mapping[str, str] | None) -> dict[str, Any]:
        """The POST's arguments, with one idempotency key for this request and all its retries."""
        kwargs = score_request_kwargs(items, scorers, pin, self.multipart)
        kwargs["headers"] = {**kwargs.get("headers", {}), IDEMPOTENCY_KEY_HEADER: uuid.uuid4().hex}
        return kwargs

    def _retry_delay(self, attempt: int, response: httpx.Response | None) -> float | None:
        """Seconds to wait before retrying, or None when `response` is final. `None` response:
        a connection error. `Retry-After` wins over exponential backoff with ±50% jitter."""
        if response is not None and (response.status_code not in RETRY_STATUS or attempt >= self.max_retries):
            return None
        if response is not None and (retry_after := response.headers.get("retry-after")):
            try:
                return min(self.max_backoff_s, float(retry_after)) + random.random() * self.backoff_s
            except ValueError:
                pass
        return min(self.max_backoff_s, self.backoff_s * 2**attempt) * (0.5 + random.random() / 2)


class RewardClient(_Base):
    """Synchronous client. Use as a context manager (or call `close()`) to release connections."""

    def __init__(self, url: str, *, transport: httpx.BaseTransport | None = None, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self._http = httpx.Client(
            base_url=self.url, timeout=self.timeout, headers=self.headers, transport=transport
        )

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def scorers(self) -> list[dict[str, Any]]:
        response = self._http.get(SCORERS_ROUTE)
        if response.status_code != 200:
            _parse(response, True)
        return response.json()["scorers"]

    def score(
        self,
        items: Iterable[ScoreItem | Mapping[str, Any]],
        scorers: list[str],
        *,
        pin: Mapping[str, str] | None = None,
        allow_partial: bool | None = None,
    ) -> list[ItemScores]:
        kwargs = self._prepare(items, scorers, pin)
        for attempt in itertools.count():
            response = None
            try:
                response = self._http.post(SCORE_ROUTE, **kwargs)
            except RETRY_EXCEPTIONS:
                if attempt >= self.max_retries:
                    raise
            if (delay := self._retry_delay(attempt, response)) is None:
                return _parse(response, self.allow_partial if allow_partial is None else allow_partial)
            time.sleep(delay)

    # --- lifecycle: share the GPU with a trainer over time (docs/lifecycle.md)

    def _lifecycle(self, action: str, scorers: Sequence[str] | None, timeout_s: float | None) -> dict:
        kwargs = {"json": _lifecycle_body(scorers, timeout_s)}
        for attempt in itertools.count():  # 503s (onload_failed, drain_timeout) retry like scores
            response = None
            try:
                response = self._http.post(lifecycle_route(action), **kwargs)
            except RETRY_EXCEPTIONS:
                if attempt >= self.max_retries:
                    raise
            if (delay := self._retry_delay(attempt, response)) is None:
                return _json(response)["results"]
            time.sleep(delay)

    def offload(self, scorers: Sequence[str] | None = None, *, timeout_s: float | None = None) -> dict:
        """Drain, then move the scorers' weights (None: every scorer) to host memory and free the
        GPU memory. Results by scorer (`state`, `changed`, `transfer`). Idempotent."""
        return self._lifecycle("offload", scorers, timeout_s)

    def onload(self, scorers: Sequence[str] | None = None) -> dict:
        """Weights back on the GPU, warmed up; returns when they score. Idempotent. Out of GPU
        memory is retried (503 `onload_failed`), then raises `ServiceError`."""
        return self._lifecycle("onload", scorers, None)

    def drain(self, scorers: Sequence[str] | None = None, *, timeout_s: float | None = None) -> dict:
        """Stop admission (new requests get 503 `draining`) and wait for in-flight ones."""
        return self._lifecycle("drain", scorers, timeout_s)

    def lifecycle(self) -> dict[str, Any]:
        """`GET /v1/lifecycle`: state, bytes on the GPU and transition times per scorer."""
        return _json(self._http.get(LIFECYCLE_ROUTE))

    @contextlib.contextmanager
    def resident(self, scorers: Sequence[str] | None = None) -> Iterator[RewardClient]:
        """Onload on entry, offload on exit (an exception too): around a trainer's scoring phase."""
        self.onload(scorers)
        try:
            yield self
        finally:
            self.offload(scorers)


class AsyncRewardClient(_Base):
    """asyncio client with the same semantics as `RewardClient`."""

    def __init__(
        self,
        url: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        max_connections: int = 100,
        scorers: Sequence[str] | None = None,
        stream_batch: int = 64,
        stream_wait_ms: float = 5.0,
        stream_in_flight: int = 8,
        **kwargs: Any,
    ) -> None:
        super().__init__(url, **kwargs)
        self._http = httpx.AsyncClient(
            base_url=self.url,
            timeout=self.timeout,
            headers=self.headers,
            transport=transport,
            limits=httpx.Limits(max_connections=max_connections),
        )
        self.default_scorers = tuple(scorers) if scorers else ()
        self._stream = _Stream(self, max(1, stream_batch), stream_wait_ms / 1000, max(1, stream_in_flight))

    async def __aenter__(self) -> AsyncRewardClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._stream.aclose()  # what was submitted is still sent
        await self._http.aclose()

    def submit(
        self, item: ScoreItem | Mapping[str, Any], scorers: Sequence[str] | None = None
    ) -> asyncio.Future[ItemScores]:
        """Queue one item for scoring and return its future at once (call from the event loop).

        Items submitted from any number of coroutines are sent together, `stream_batch` per
        request, at most `stream_wait_ms` after the first of a request arrived, so a trainer
        can score each rollout as it finishes. The future resolves to the item's `ItemScores`
        (ids are the caller's; duplicates are fine), or raises `ScoreError` for that item alone
        (unless `allow_partial`), or the request's `ServiceError`. A 429 pauses sending for its
        `Retry-After` and halves the requests in flight (at most `stream_in_flight`)."""
        names = tuple(scorers) if scorers else self.default_scorers
        if not names:
            raise ValueError(
                "submit needs scorers: submit(item, scorers) or AsyncRewardClient(url, scorers=...)"
            )
        return self._stream.submit(item, names)

    async def flush(self) -> None:
        """Send every queued item now and wait until every submitted future is resolved."""
        await self._stream.drain()

    async def scorers(self) -> list[dict[str, Any]]:
        response = await self._http.get(SCORERS_ROUTE)
        if response.status_code != 200:
            _parse(response, True)
        return response.json()["scorers"]

    async def score(
        self,
        items: Iterable[ScoreItem | Mapping[str, Any]],
        scorers: list[str],
        *,
        pin: Mapping[str, str] | None = None,
        allow_partial: bool | None = None,
    ) -> list[ItemScores]:
        kwargs = self._prepare(items, scorers, pin)
        for attempt in itertools.count():
            response = None
            try:
                response = await self._http.post(SCORE_ROUTE, **kwargs)
            except RETRY_EXCEPTIONS:
                if attempt >= self.max_retries:
                    raise
            if (delay := self._retry_delay(attempt, response)) is None:
                return _parse(response, self.allow_partial if allow_partial is None else allow_partial)
            await asyncio.sleep(delay)

    # --- lifecycle (docs/lifecycle.md): as RewardClient's

    async def _lifecycle(self, action: str, scorers: Sequence[str] | None, timeout_s: float | None) -> dict:
        kwargs = {"json": _lifecycle_body(scorers, timeout_s)}
        for attempt in itertools.count():
            response = None
            try:
                response = await self._http.post(lifecycle_route(action), **kwargs)
            except RETRY_EXCEPTIONS:
                if attempt >= self.max_retries:
                    raise
            if (delay := self._retry_delay(attempt, response)) is None:
                return _json(response)["results"]
            await asyncio.sleep(delay)

    async def offload(self, scorers: Sequence[str] | None = None, *, timeout_s: float | None = None) -> dict:
        return await self._lifecycle("offload", scorers, timeout_s)

    async def onload(self, scorers: Sequence[str] | None = None) -> dict:
        return await self._lifecycle("onload", scorers, None)

    async def drain(self, scorers: Sequence[str] | None = None, *, timeout_s: float | None = None) -> dict:
        return await self._lifecycle("drain", scorers, timeout_s)

    async def lifecycle(self) -> dict[str, Any]:
        return _json(await self._http.get(LIFECYCLE_ROUTE))

    @contextlib.asynccontextmanager
    async def resident(self, scorers: Sequence[str] | None = None) -> AsyncIterator[AsyncRewardClient]:
        await self.onload(scorers)
        try:
            yield self
        finally:
            await self.offload(scorers)


# ------------------------------------------------------------------- streaming (submit -> Future)


def _item_id(item: ScoreItem | Mapping[str, Any], position: int) -> str:
    value = item.id if isinstance(item, ScoreItem) else item.get("id")
    return str(position) if value is None else str(value)


def _with_id(item: ScoreItem | Mapping[str, Any], wire_id: str) -> ScoreItem | dict[str, Any]:
    return dataclasses.replace(item, id=wire_id) if isinstance(item, ScoreItem) else {**item, "id": wire_id}


class _Stream:
    """`AsyncRewardClient.submit`'s machinery: items from many coroutines wait in one queue per
    scorer set and leave in requests of up to `max_batch` items, at the latest `max_wait_s` after
    the oldest arrived. At most `window` requests are in flight; a 429 halves the window and
    pauses every send for its `Retry-After`, each success widens it by one (up to
    `max_in_flight`), so a saturated service slows the submitters instead of being retried
    harder. Each item's future gets its `ItemScores`, or `ScoreError` for that item alone, or the
    request's `ServiceError` / connection error."""

    def __init__(
        self, client: AsyncRewardClient, max_batch: int, max_wait_s: float, max_in_flight: int
    ) -> None:
        self.client = client
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.max_in_flight = max_in_flight
        self.window = max_in_flight
        self.in_flight = 0
        self.paused_until = 0.0
        self.queues: dict[tuple[str, ...], list[tuple[Any, asyncio.Future]]] = {}
        self.timers: dict[tuple[str, ...], asyncio.TimerHandle] = {}
        self.ready: asyncio.Condition | None = None
        self.tasks: set[asyncio.Task] = set()
        self.closed = False

    def submit(self, item: Any, scorers: tuple[str, ...]) -> asyncio.Future:
        if self.closed:
            raise RuntimeError("the client is closed")
        loop = asyncio.get_running_loop()
        if self.ready is None:
            self.ready = asyncio.Condition()
        future = loop.create_future()
        queue = self.queues.setdefault(scorers, [])
        queue.append((item, future))
        if len(queue) >= self.max_batch:
            self._flush(scorers)
        elif scorers not in self.timers:
            self.timers[scorers] = loop.call_later(self.max_wait_s, self._flush, scorers)
        return future

    def _flush(self, scorers: tuple[str, ...]) -> None:
        timer = self.timers.pop(scorers, None)
        if timer is not None:
            timer.cancel()
        queue = self.queues.get(scorers, [])
        while queue:
            batch, queue[:] = queue[: self.max_batch], queue[self.max_batch :]
            task = asyncio.get_running_loop().create_task(self._send(list(scorers), batch))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _slot(self) -> None:
        assert self.ready is not None
        async with self.ready:
            await self.ready.wait_for(lambda: self.in_flight < self.window)
            self.in_flight += 1

    async def _release(self, ok: bool | None) -> None:
        assert self.ready is not None
        async with self.ready:
            self.in_flight -= 1
            if ok is True:
                self.window = min(self.max_in_flight, self.window + 1)
            elif ok is False:
                self.window = max(1, self.window // 2)
            self.ready.notify_all()

    async def _send(self, scorers: list[str], batch: list[tuple[Any, asyncio.Future]]) -> None:
        live = [(item, fut) for item, fut in batch if not fut.cancelled()]
        if not live:
            return
        client = self.client
        # Submitters choose their ids independently: the wire gets positions, the futures the ids.
        ids = [_item_id(item, n) for n, (item, _) in enumerate(live)]
        kwargs = client._prepare([_with_id(item, str(n)) for n, (item, _) in enumerate(live)], scorers, None)
        try:
            for attempt in itertools.count():
                if (wait := self.paused_until - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                await self._slot()
                response, ok = None, None
                try:
                    response = await client._http.post(SCORE_ROUTE, **kwargs)
                    ok = response.status_code != 429
                except RETRY_EXCEPTIONS:
                    if attempt >= client.max_retries:
                        raise
                finally:
                    await self._release(ok)
                delay = client._retry_delay(attempt, response)
                if delay is None:
                    break
                if response is not None and response.status_code == 429:
                    self.paused_until = max(self.paused_until, time.monotonic() + delay)
                else:
                    await asyncio.sleep(delay)
            results = _parse(response, True)
        except Exception as exc:  # the whole request failed: every item of it
            for _, fut in live:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for (_, fut), item_id, wire in zip(live, ids, results, strict=True):
            result = ItemScores(item_id, wire.scores, wire.errors, wire.details)
            if fut.done():
                continue
            failures = [ItemFailure(result.id, s, e["code"], e["message"]) for s, e in result.errors.items()]
            if failures and not client.allow_partial:
                fut.set_exception(ScoreError(failures, [result]))
            else:
                fut.set_result(result)

    async def drain(self) -> None:
        """Send everything still queued and wait for every request in flight."""
        for scorers in list(self.queues):
            self._flush(scorers)
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)

    async def aclose(self) -> None:
        await self.drain()
        self.closed = True
