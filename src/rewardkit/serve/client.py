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

from rewardkit.core.errors import RewardkitError
from rewardkit.serve.protocol import (
    HTTP_ERROR_CODE,
    IDEMPOTENCY_KEY_HEADER,
    LIFECYCLE_ROUTE,
    MULTIPART_REQUEST_PART,
    SCORE_ROUTE,
    SCORERS_ROUTE,
    encode_score_request,
    lifecycle_route,
)
from rewardkit.serve.scorers.base import ScoreItem

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


class ServiceError(RewardkitError):
    """A whole-request error from the service (4xx/5xx with `{"code", "message"}`), after retries."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"HTTP {status} {code}: {message}", code=code)
        self.status = status


class ScoreError(RewardkitError):
    """Some items failed; `failures` lists each (id, scorer, code), `results` holds everything."""

    code = "score_failed"

    def __init__(self, failures: list[ItemFailure], results: list[ItemScores]) -> None:
        head = ", ".join(f"{f.id}/{f.scorer}: {f.code}" for f in failures[:5])
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
    results = [ItemScores(r["id"], r["scores"], r.get("errors") or {}) for r in response.json()["results"]]
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
        token = token or os.environ.get("REWARDKIT_TOKEN")
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

    async def __aenter__(self) -> AsyncRewardClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

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
