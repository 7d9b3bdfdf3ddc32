"""Clients for the reward service: `RewardClient` (sync) and `AsyncRewardClient` (asyncio).

Both reuse one HTTP connection pool, retry 429 / 503 / connection failures with exponential
backoff and jitter (`serve/retries.py`: a `Retry-After` from the server wins over the computed
delay), and send one `Idempotency-Key` per logical request, the same on every retry, so server
logs can tie retries together (scoring is side-effect free, so a retried request cannot
double-count anything).

A failed item never comes back as a number: unless `allow_partial=True`, any per-item error
raises `ScoreError` listing every failed (item, scorer) with its code. A whole request that
fails raises `ServiceError`: the service's error answer (401, `unknown_scorer`, 429 after the
retries, ...), or, when no answer came, `connection_failed` / `client_timeout` after the retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from rewardplane.core.errors import RewardplaneError
from rewardplane.serve.protocol import (
    AUDIT_ROUTE,
    FAILURE_KINDS,
    HTTP_ERROR_CODE,
    IDEMPOTENCY_KEY_HEADER,
    INVALID_RESPONSE_CODE,
    LIFECYCLE_ROUTE,
    MULTIPART_REQUEST_PART,
    RESPONSE_PROBLEMS,
    SCORE_ROUTE,
    SCORERS_ROUTE,
    ItemScores,
    ScoreItem,
    decode_score_response,
    encode_score_request,
    failure_kind,
    lifecycle_route,
)
from rewardplane.serve.retries import RetryPolicy

Items = Iterable[ScoreItem | Mapping[str, Any]]
"""What `score` takes: `ScoreItem`s, or wire items as mappings (raw image bytes allowed)."""
Pins = Mapping[str, str] | None
"""Scorer name → the identity it must have (409 `identity_mismatch` otherwise)."""

CONNECTION_FAILED = "connection_failed"
"""`ServiceError.code` when no answer came: refused, reset or unresolvable, after the retries."""
CLIENT_TIMEOUT = "client_timeout"
"""`ServiceError.code` when no answer came within the client's `timeout` (after the retries)."""


@dataclass(frozen=True)
class ItemFailure:
    id: str
    scorer: str
    code: str
    message: str
    kind: str = ""
    """`item` (the policy's own failure) or `service` (mask or retry); empty: `failure_kind(code)`."""

    def __post_init__(self) -> None:
        if self.kind not in FAILURE_KINDS:
            object.__setattr__(self, "kind", failure_kind(self.code))


class ServiceError(RewardplaneError):
    """A whole request failed, after the retries: the service's error answer (4xx/5xx with
    `{"code", "message"}`; `status` is its HTTP status), or no answer at all (`status` None,
    `code` `connection_failed` or `client_timeout`)."""

    def __init__(self, status: int | None, code: str, message: str) -> None:
        super().__init__(
            f"HTTP {status} {code}: {message}" if status is not None else f"{code}: {message}", code=code
        )
        self.status = status


def _no_answer(exc: httpx.TransportError, url: str) -> ServiceError:
    code = CLIENT_TIMEOUT if isinstance(exc, httpx.TimeoutException) else CONNECTION_FAILED
    return ServiceError(None, code, f"no answer from {url} ({type(exc).__name__}: {exc})")


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

    @property
    def service_failures(self) -> list[ItemFailure]:
        """The failures that are not the policy's doing (mask the samples, or retry the batch)."""
        return [f for f in self.failures if f.kind == "service"]

    @property
    def item_failures(self) -> list[ItemFailure]:
        """The items' own failures (what the policy wrote): penalise, never retry."""
        return [f for f in self.failures if f.kind == "item"]


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


def _parse(
    response: httpx.Response,
    allow_partial: bool,
    ids: Sequence[str] | None = None,
    scorers: Sequence[str] | None = None,
) -> list[ItemScores]:
    """The answer to a request for `ids` × `scorers`, decoded by `protocol.decode_score_response`
    (the load generator's decoder): every id back once, in order, every score a finite number,
    or `ServiceError` (`invalid_response` for a 200 that is not that answer)."""
    if response.status_code != 200:
        try:
            body = response.json()
            code, message = str(body.get("code", HTTP_ERROR_CODE)), str(body.get("message", ""))
        except (ValueError, AttributeError):
            code, message = HTTP_ERROR_CODE, response.text[:200]
        raise ServiceError(response.status_code, code, message)
    decoded = decode_score_response(response.content, ids, scorers)
    if decoded.problems:
        found = "; ".join(RESPONSE_PROBLEMS[p] for p in decoded.problems)
        raise ServiceError(200, INVALID_RESPONSE_CODE, f"the answer is not what was asked: {found}")
    results = decoded.results
    failures = [
        ItemFailure(r.id, s, e["code"], e["message"], e.get("kind", ""))
        for r in results
        for s, e in r.errors.items()
    ]
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


def _audit_params(summary: bool) -> dict[str, str]:
    return {"summary": "true"} if summary else {}


def _json(response: httpx.Response) -> dict[str, Any]:
    if response.status_code != 200:
        _parse(response, True)  # raises ServiceError with the body's code
    return response.json()


class _Base:
    def __init__(
        self,
        url: str,
        *,
        timeout: float = 120.0,
        token: str | None = None,
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
        self.retry = RetryPolicy(max_retries, backoff_s, max_backoff_s)
        self.allow_partial = allow_partial
        self.multipart = multipart

    def _prepare(self, items, scorers: list[str], pin: Mapping[str, str] | None) -> dict[str, Any]:
        """The POST's arguments, with one idempotency key for this request and all its retries."""
        kwargs = score_request_kwargs(items, scorers, pin, self.multipart)
        kwargs["headers"] = {**kwargs.get("headers", {}), IDEMPOTENCY_KEY_HEADER: uuid.uuid4().hex}
        return kwargs

    def _score_call(
        self, items: Items, scorers: list[str], pin: Pins, allow_partial: bool | None
    ) -> tuple[dict[str, Any], Callable[[httpx.Response], list[ItemScores]]]:
        """(the POST's arguments, how to read its answer): the answer must hold the ids sent."""
        items = list(items)
        ids = [_item_id(item, n) for n, item in enumerate(items)]
        partial = self.allow_partial if allow_partial is None else allow_partial
        return self._prepare(items, scorers, pin), functools.partial(
            _parse, allow_partial=partial, ids=ids, scorers=scorers
        )


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

    def _send(self, method: str, route: str, **kwargs: Any) -> httpx.Response:
        """The answer to one request under the retry policy; no answer is `ServiceError`."""
        try:
            return self.retry.retrying()(self._http.request, method, route, **kwargs)
        except httpx.TransportError as exc:
            raise _no_answer(exc, self.url) from exc

    def scorers(self) -> list[dict[str, Any]]:
        return _json(self._send("GET", SCORERS_ROUTE))["scorers"]

    def score(
        self, items: Items, scorers: list[str], *, pin: Pins = None, allow_partial: bool | None = None
    ) -> list[ItemScores]:
        kwargs, finish = self._score_call(items, scorers, pin, allow_partial)
        return finish(self._send("POST", SCORE_ROUTE, **kwargs))

    # --- lifecycle: share the GPU with a trainer over time (docs/lifecycle.md)

    def _lifecycle(self, action: str, scorers: Sequence[str] | None, timeout_s: float | None) -> dict:
        # 503s (onload_failed, drain_timeout) retry like scores
        return _json(self._send("POST", lifecycle_route(action), json=_lifecycle_body(scorers, timeout_s)))[
            "results"
        ]

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
        return _json(self._send("GET", LIFECYCLE_ROUTE))

    def audit(self, *, summary: bool = True) -> dict[str, Any]:
        """`GET /v1/audit` (docs/audit.md): counters, alarms and bins (`summary`: the newest closed
        bin only). `serve.protocol.flat_metrics` / `firing` read it as trainers log it. A service
        without an `audit:` section answers 404: `ServiceError`."""
        return _json(self._send("GET", AUDIT_ROUTE, params=_audit_params(summary)))

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

    async def _send(self, method: str, route: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self.retry.async_retrying()(self._http.request, method, route, **kwargs)
        except httpx.TransportError as exc:
            raise _no_answer(exc, self.url) from exc

    async def scorers(self) -> list[dict[str, Any]]:
        return _json(await self._send("GET", SCORERS_ROUTE))["scorers"]

    async def score(
        self, items: Items, scorers: list[str], *, pin: Pins = None, allow_partial: bool | None = None
    ) -> list[ItemScores]:
        kwargs, finish = self._score_call(items, scorers, pin, allow_partial)
        return finish(await self._send("POST", SCORE_ROUTE, **kwargs))

    # --- lifecycle (docs/lifecycle.md): as RewardClient's

    async def _lifecycle(self, action: str, scorers: Sequence[str] | None, timeout_s: float | None) -> dict:
        response = await self._send("POST", lifecycle_route(action), json=_lifecycle_body(scorers, timeout_s))
        return _json(response)["results"]

    async def offload(self, scorers: Sequence[str] | None = None, *, timeout_s: float | None = None) -> dict:
        return await self._lifecycle("offload", scorers, timeout_s)

    async def onload(self, scorers: Sequence[str] | None = None) -> dict:
        return await self._lifecycle("onload", scorers, None)

    async def drain(self, scorers: Sequence[str] | None = None, *, timeout_s: float | None = None) -> dict:
        return await self._lifecycle("drain", scorers, timeout_s)

    async def lifecycle(self) -> dict[str, Any]:
        return _json(await self._send("GET", LIFECYCLE_ROUTE))

    async def audit(self, *, summary: bool = True) -> dict[str, Any]:
        return _json(await self._send("GET", AUDIT_ROUTE, params=_audit_params(summary)))

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
    request's `ServiceError` (with no answer: `connection_failed` / `client_timeout`)."""

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

        async def attempt() -> httpx.Response:
            if (wait := self.paused_until - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            await self._slot()
            ok = None
            try:
                response = await client._http.post(SCORE_ROUTE, **kwargs)
                ok = response.status_code != 429
                return response
            finally:
                await self._release(ok)

        def pause_all(state: Any) -> None:  # a 429 holds back every send of this client, not only this one
            if not state.outcome.failed and state.outcome.result().status_code == 429:
                self.paused_until = max(self.paused_until, time.monotonic() + state.upcoming_sleep)

        try:
            try:
                response = await client.retry.async_retrying(before_sleep=pause_all)(attempt)
            except httpx.TransportError as exc:
                raise _no_answer(exc, client.url) from exc
            results = _parse(response, True, [str(n) for n in range(len(live))], scorers)
        except Exception as exc:  # the whole request failed: every item of it
            for _, fut in live:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for (_, fut), item_id, wire in zip(live, ids, results, strict=True):
            result = ItemScores(item_id, wire.scores, wire.errors, wire.details)
            if fut.done():
                continue
            failures = [
                ItemFailure(result.id, s, e["code"], e["message"], e.get("kind", ""))
                for s, e in result.errors.items()
            ]
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
