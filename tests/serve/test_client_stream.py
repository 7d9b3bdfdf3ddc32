"""`AsyncRewardClient.submit`: items from many coroutines batched into requests by size and
time, each item's own result or error, and back-pressure from 429."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from rewardplane.serve.client import AsyncRewardClient, ItemScores, ScoreError, ServiceError
from support.serve import LiveServer, make_config

SCORERS = [{"name": "double", "kind": "double", "max_wait_ms": 1}, {"name": "len", "kind": "length"}]


class Counting(httpx.AsyncHTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sizes.append(len(json.loads(request.content)["items"]))
        return await super().handle_async_request(request)


@pytest.fixture(scope="module")
def server():
    with LiveServer(make_config(SCORERS)) as live:
        yield live


def test_items_from_many_coroutines_share_requests(server):
    transport = Counting()

    async def main():
        async with AsyncRewardClient(
            server.url, scorers=["len"], transport=transport, stream_batch=16, stream_wait_ms=20
        ) as client:

            async def rollout(n: int) -> ItemScores:
                await asyncio.sleep(0.001 * (n % 5))
                return await client.submit({"id": "same-id", "prompt": "p", "response": "x" * n})

            return await asyncio.gather(*(rollout(n) for n in range(1, 41)))

    results = asyncio.run(main())
    assert [r.scores["len"] for r in results] == [float(n) for n in range(1, 41)]
    assert all(r.id == "same-id" for r in results)  # ids are the submitters', duplicates allowed
    assert sum(transport.sizes) == 40 and len(transport.sizes) <= 6 and max(transport.sizes) <= 16


def test_a_failed_item_fails_only_its_own_future(server):
    async def main():
        async with AsyncRewardClient(server.url, stream_wait_ms=10) as client:
            futs = [
                client.submit({"id": str(n), "response": text}, ["double", "len"])
                for n, text in enumerate(["ok", "NAN", "fine"])
            ]
            return await asyncio.gather(*futs, return_exceptions=True)

    ok, failed, fine = asyncio.run(main())
    assert ok.scores == {"double": 2.0, "len": 2.0} and fine.scores["len"] == 4.0
    assert isinstance(failed, ScoreError)
    assert [(f.id, f.scorer, f.code) for f in failed.failures] == [("1", "double", "non_finite")]

    async def partial():
        async with AsyncRewardClient(server.url, allow_partial=True) as client:
            return await client.submit({"id": "a", "response": "NAN"}, ["double"])

    result = asyncio.run(partial())
    assert result.scores == {} and result.errors["double"]["code"] == "non_finite"


def test_a_whole_request_error_reaches_every_future_of_it(server):
    async def main():
        async with AsyncRewardClient(server.url, scorers=["nope"]) as client:
            return await asyncio.gather(
                *(client.submit({"id": str(n), "response": "r"}) for n in range(3)), return_exceptions=True
            )

    errors = asyncio.run(main())
    assert all(isinstance(e, ServiceError) and e.code == "unknown_scorer" for e in errors)
    with pytest.raises(ValueError, match="scorers"):
        asyncio.run(AsyncRewardClient(server.url).submit({"id": "a"}))


def test_429_halves_the_window_and_pauses_sending():
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        items = json.loads(request.content)["items"]
        if calls["n"] <= 2:
            return httpx.Response(
                429, json={"code": "queue_full", "message": "busy"}, headers={"Retry-After": "0"}
            )
        results = [{"id": i["id"], "scores": {"len": float(len(i["response"]))}, "errors": {}} for i in items]
        return httpx.Response(200, json={"results": results, "scorers": {}})

    async def main():
        client = AsyncRewardClient(
            "http://test",
            scorers=["len"],
            transport=httpx.MockTransport(handler),
            stream_batch=4,
            stream_wait_ms=1,
            stream_in_flight=8,
            backoff_s=0.01,
        )
        futs = [client.submit({"id": str(n), "response": "x" * n}) for n in range(12)]
        out = await asyncio.gather(*futs)
        window = client._stream.window
        await client.aclose()
        return out, window

    out, window = asyncio.run(main())
    assert [r.scores["len"] for r in out] == [float(n) for n in range(12)]
    assert window < 8  # two 429s shrank it; successes widen it again one by one


def test_closing_sends_what_is_queued(server):
    async def main():
        client = AsyncRewardClient(server.url, scorers=["len"], stream_wait_ms=10_000)  # no timer would fire
        fut = client.submit({"id": "a", "response": "abc"})
        await client.aclose()
        return fut.result()

    assert asyncio.run(main()).scores == {"len": 3.0}
