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
import base64
import itertools
import json
import os
import random
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from rewardkit.core.errors import RewardkitError
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


def _item_json(item: ScoreItem | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(item, ScoreItem):
        out: dict[str, Any] = {"id": item.id, "prompt": item.prompt, "response": item.response}
        if item.image is not None:
            out["image"] = {"b64": base64.b64encode(item.image).decode("ascii")}
        if item.reference is not None:
            out["reference"] = item.reference
        return out
    out = dict(item)
    if isinstance(out.get("image"), bytes | bytearray):
        out["image"] = {"b64": base64.b64encode(out["image"]).decode("ascii")}
    return out


def score_request_kwargs(
    items: Iterable[ScoreItem | Mapping[str, Any]],
    scorers: list[str],
    pin: Mapping[str, str] | None,
    multipart: bool,
) -> dict[str, Any]:
    """httpx keyword arguments for one POST /v1/score."""
    payload = {"scorers": list(scorers), "items": [_item_json(i) for i in items]}
    if pin:
        payload["pin"] = dict(pin)
    if not multipart:
        return {"content": json.dumps(payload), "headers": {"content-type": "application/json"}}
    files = []
    for n, item in enumerate(payload["items"]):
        if isinstance(item.get("image"), dict) and "b64" in item["image"]:
            name = f"image{n}"
            files.append((name, (name, base64.b64decode(item["image"]["b64"]), "application/octet-stream")))
            item["image"] = {"part": name}
    return {"files": [("request", (None, json.dumps(payload), "application/json")), *files]}


def _parse(response: httpx.Response, allow_partial: bool) -> list[ItemScores]:
    if response.status_code != 200:
        try:
            body = response.json()
            code, message = str(body.get("code", "http_error")), str(body.get("message", ""))
        except (ValueError, AttributeError):
            code, message = "http_error", response.text[:200]
        raise ServiceError(response.status_code, code, message)
    results = [ItemScores(r["id"], r["scores"], r.get("errors") or {}) for r in response.json()["results"]]
    failures = [ItemFailure(r.id, s, e["code"], e["message"]) for r in results for s, e in r.errors.items()]
    if failures and not allow_partial:
        raise ScoreError(failures, results)
    return results


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
        kwargs["headers"] = {**kwargs.get("headers", {}), "idempotency-key": uuid.uuid4().hex}
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
        response = self._http.get("/v1/scorers")
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
                response = self._http.post("/v1/score", **kwargs)
            except RETRY_EXCEPTIONS:
                if attempt >= self.max_retries:
                    raise
            if (delay := self._retry_delay(attempt, response)) is None:
                return _parse(response, self.allow_partial if allow_partial is None else allow_partial)
            time.sleep(delay)


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
        response = await self._http.get("/v1/scorers")
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
                response = await self._http.post("/v1/score", **kwargs)
            except RETRY_EXCEPTIONS:
                if attempt >= self.max_retries:
                    raise
            if (delay := self._retry_delay(attempt, response)) is None:
                return _parse(response, self.allow_partial if allow_partial is None else allow_partial)
            await asyncio.sleep(delay)
