"""Whole-request failures reach every adapter's caller as the documented `ServiceError`, after
the client's retries (two, with their real backoff: the service runs in this process, so
sleeps are not patched): a refused connection, a service that does not answer in time, a wrong
token, a scorer the service does not host. Never httpx's own exception, never a number.

Each adapter is driven the way its trainer calls it: TRL's reward functions called as
`GRPOTrainer._calculate_rewards` calls them; verl's functions through verl's own
`RewardLoopWorker` (tests/support/verl_loop.py); the async client's `score` and `submit`."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator

import pytest

from rewardplane.integrations.trl import AsyncRemoteReward, RemoteReward
from rewardplane.serve.client import AsyncRewardClient, ServiceError

FAILURES = {  # failure -> (ServiceError.code, ServiceError.status)
    "refused": ("connection_failed", None),
    "no_answer": ("client_timeout", None),
    "wrong_token": ("unauthorized", 401),
    "unknown_scorer": ("unknown_scorer", 422),
}


@pytest.fixture(scope="module")
def silent_url() -> Iterator[str]:
    """A listener that accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(scope="module")
def refused_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def target(request, token_server, refused_url, silent_url) -> dict:
    """(url, scorer, token) giving the failure named by the test's parameter."""
    return {
        "refused": {"url": refused_url, "scorer": "len", "token": None, "timeout": 30.0},
        "no_answer": {"url": silent_url, "scorer": "len", "token": None, "timeout": 0.5},
        "wrong_token": {"url": token_server.url, "scorer": "len", "token": "wrong", "timeout": 30.0},
        "unknown_scorer": {"url": token_server.url, "scorer": "nope", "token": "tok", "timeout": 30.0},
    }[request.param]


def settings(t: dict) -> dict:
    return {"token": t["token"], "timeout": t["timeout"], "max_retries": 2}


def trl_sync(t: dict) -> Callable[[], object]:
    reward = RemoteReward(t["url"], scorer=t["scorer"], on_error="none", **settings(t))
    return lambda: reward(prompts=["p", "q"], completions=["a", "b"])


def trl_async(t: dict) -> Callable[[], object]:
    reward = AsyncRemoteReward(t["url"], scorer=t["scorer"], on_error="none", **settings(t))
    return lambda: asyncio.run(reward(prompts=["p", "q"], completions=["a", "b"]))


def client_submit(t: dict) -> Callable[[], object]:
    async def call():
        async with AsyncRewardClient(t["url"], scorers=[t["scorer"]], **settings(t)) as client:
            return await client.submit({"id": "a", "prompt": "p", "response": "a"})

    return lambda: asyncio.run(call())


def client_score(t: dict) -> Callable[[], object]:
    async def call():
        async with AsyncRewardClient(t["url"], **settings(t)) as client:
            return await client.score([{"id": "a", "prompt": "p", "response": "a"}], [t["scorer"]])

    return lambda: asyncio.run(call())


@pytest.mark.parametrize("target", list(FAILURES), indirect=True)
@pytest.mark.parametrize("adapter", [trl_sync, trl_async, client_submit, client_score])
def test_trl_and_the_async_client(target, adapter, request):
    with pytest.raises(ServiceError) as info:
        adapter(target)()
    failure = request.node.callspec.params["target"]
    assert (info.value.code, info.value.status) == FAILURES[failure]


@pytest.mark.parametrize("target", list(FAILURES), indirect=True)
@pytest.mark.parametrize("name", ["compute_score_async", "compute_score"])
def test_verl_through_its_reward_loop(target, name, request, tmp_path):
    pytest.importorskip("verl.experimental.reward_loop")
    from support.verl_loop import chunk, reward_loop_worker

    w = reward_loop_worker(tmp_path, name, url=target["url"], scorer=target["scorer"], **settings(target))
    with pytest.raises(ServiceError) as info:
        w.loop.run_until_complete(w.compute_score_batch(chunk()))
    failure = request.node.callspec.params["target"]
    assert (info.value.code, info.value.status) == FAILURES[failure]
