"""Lifecycle: the per-scorer state machine (offload, onload, drain, residency) on fake weights;
its HTTP contract is tests/serve/test_lifecycle_http.py."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from rewardplane.core.errors import ConfigError
from rewardplane.serve.lifecycle import (
    LIFECYCLE_ERROR_CODES,
    Lifecycle,
    LifecyclePolicy,
    ScorerLifecycle,
)
from rewardplane.serve.protocol import ServeError


class FakeWeights:
    """Counts moves; `fail_onloads` makes that many onloads raise like an OOM, with bytes."""

    def __init__(self, nbytes: int = 1000, delay_s: float = 0.0) -> None:
        self.nbytes = nbytes
        self.on_device = True
        self.moves: list[str] = []
        self.fail_onloads = 0
        self.delay_s = delay_s
        self.concurrent = 0
        self.max_concurrent = 0
        self._guard = threading.Lock()

    def _move(self, direction: str) -> dict:
        with self._guard:
            self.concurrent += 1
            self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            time.sleep(self.delay_s)
            if direction == "onload" and self.fail_onloads:
                self.fail_onloads -= 1
                err = RuntimeError(f"onload needs {self.nbytes} bytes on cuda:0, 10 bytes free")
                err.bytes_needed = self.nbytes
                raise err
            self.moves.append(direction)
            self.on_device = direction == "onload"
            return {"bytes": self.nbytes}
        finally:
            with self._guard:
                self.concurrent -= 1

    def offload(self) -> dict:
        return self._move("offload")

    def onload(self) -> dict:
        return self._move("onload")

    def bytes_total(self) -> int:
        return self.nbytes

    def bytes_on_device(self) -> int:
        return self.nbytes if self.on_device else 0


async def in_thread(fn):
    return await asyncio.to_thread(fn)


def machine(policy: LifecyclePolicy | None = None, **kw) -> tuple[ScorerLifecycle, FakeWeights]:
    weights = kw.pop("weights", None) or FakeWeights()
    return ScorerLifecycle("s", weights, run=in_thread, policy=policy, **kw), weights


async def until(condition, ceiling_s: float = 60.0) -> None:
    """Until `condition()` holds (an idle offload is a timer and a thread's move: late on a
    loaded machine), with a ceiling."""
    deadline = time.monotonic() + ceiling_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def hold(m: ScorerLifecycle, seconds: float, log: list[str] | None = None) -> None:
    async with m.admit():
        await asyncio.sleep(seconds)
        if log is not None:
            log.append("finished")


def test_error_codes_are_declared_with_statuses():
    statuses = {code: ServeError(code, "x").status for code in LIFECYCLE_ERROR_CODES}
    assert statuses == {
        "draining": 503,
        "offloaded": 503,
        "onload_failed": 503,
        "drain_timeout": 503,
        "offload_failed": 500,
    }


def test_full_cycle_states_times_and_bytes():
    async def go():
        m, w = machine()
        assert m.state == "resident" and m.describe()["bytes_on_device"] == 1000
        r = await m.offload()
        assert r["changed"] and r["state"] == "offloaded" and r["transfer"] == {"bytes": 1000}
        d = m.describe()
        assert d["bytes_on_device"] == 0 and d["bytes_total"] == 1000
        assert set(d["last_transition"]) == {"resident", "draining", "offloading", "offloaded"}
        r = await m.onload()
        assert r["changed"] and r["state"] == "resident" and r["ready_seconds"] >= 0
        assert w.moves == ["offload", "onload"]
        assert m.describe()["last_onload"]["reason"] == "request"
        assert m.describe()["transitions"] == 5

    asyncio.run(go())


def test_transitions_are_idempotent():
    async def go():
        m, w = machine()
        assert (await m.onload())["changed"] is False
        await m.offload()
        again = await m.offload()
        assert again == {"action": "offload", "changed": False, "state": "offloaded"}
        assert (await m.drain())["changed"] is False
        await m.onload()
        assert w.moves == ["offload", "onload"]

    asyncio.run(go())


def test_offloaded_scorer_refuses_at_once_with_503_and_retry_after():
    async def go():
        m, _ = machine()
        await m.offload()
        others: list[str] = []
        asyncio.get_running_loop().call_soon(others.append, "ran")
        with pytest.raises(ServeError) as err:
            async with m.admit():
                pass
        assert others == []  # refused before the loop ran anything else: nothing was waited for
        assert err.value.code == "offloaded" and err.value.status == 503 and err.value.retry_after
        assert m.in_flight == 0

    asyncio.run(go())


def test_drain_stops_admission_and_finishes_in_flight():
    async def go():
        m, _ = machine()
        log: list[str] = []
        running = asyncio.create_task(hold(m, 0.3, log))
        await asyncio.sleep(0.05)
        drain = asyncio.create_task(m.drain(timeout_s=5))
        await asyncio.sleep(0.05)
        assert m.state == "draining"
        with pytest.raises(ServeError) as err:
            async with m.admit():
                pass
        assert err.value.code == "draining" and err.value.retry_after
        r = await drain
        assert log == ["finished"] and r["drained"] and r["in_flight"] == 0
        await running
        assert (await m.onload())["changed"] and m.state == "resident"  # admission reopens
        async with m.admit():
            pass

    asyncio.run(go())


def test_offload_waits_for_in_flight_work_first():
    async def go():
        m, w = machine()
        log: list[str] = []
        running = asyncio.create_task(hold(m, 0.3, log))
        await asyncio.sleep(0.05)
        await m.offload(timeout_s=5)
        assert log == ["finished"] and w.moves == ["offload"]
        await running

    asyncio.run(go())


def test_drain_timeout_moves_nothing_and_reopens_admission():
    async def go():
        m, w = machine()
        running = asyncio.create_task(hold(m, 1.0))
        await asyncio.sleep(0.05)
        with pytest.raises(ServeError) as err:
            await m.offload(timeout_s=0.1)
        assert err.value.code == "drain_timeout" and "1 request" in err.value.message
        assert m.state == "resident" and w.moves == []
        async with m.admit():
            pass
        await running

    asyncio.run(go())


def test_failed_onload_stays_offloaded_and_healthy_and_retry_works():
    async def go():
        m, w = machine()
        await m.offload()
        w.fail_onloads = 1
        with pytest.raises(ServeError) as err:
            await m.onload()
        assert err.value.code == "onload_failed" and err.value.status == 503
        assert "1000 bytes" in err.value.message
        assert m.state == "offloaded" and "1000 bytes" in m.describe()["last_error"]
        r = await m.onload()
        assert r["changed"] and m.state == "resident" and m.describe()["last_error"] is None

    asyncio.run(go())


def test_failed_warmup_after_onload_puts_the_weights_back():
    async def go():
        calls = {"n": 0}

        async def warmup():
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("warm-up score was nan")

        m, w = machine(warmup=warmup)
        await m.offload()
        with pytest.raises(ServeError) as err:
            await m.onload()
        assert err.value.code == "onload_failed" and "nan" in err.value.message
        assert m.state == "offloaded" and w.moves == ["offload", "onload", "offload"]
        await m.onload()
        assert m.state == "resident" and calls["n"] == 2

    asyncio.run(go())


def test_concurrent_transitions_are_serialised_and_consistent():
    async def go():
        m, w = machine(weights=FakeWeights(delay_s=0.02))
        ops = [m.offload() if k % 2 == 0 else m.onload() for k in range(20)]
        ops += [m.offload() for _ in range(5)]
        results = await asyncio.gather(*ops)
        assert w.max_concurrent == 1  # never two moves at once
        assert m.state == "offloaded" and not w.on_device
        changed = [r for r in results if r["changed"]]
        assert len(changed) == len(w.moves)  # every no-op said so and moved nothing
        assert all(a != b for a, b in zip(w.moves, w.moves[1:], strict=False))  # alternating

    asyncio.run(go())


def test_auto_onload_on_request_and_concurrent_requests_share_one_onload():
    async def go():
        m, w = machine(LifecyclePolicy(auto_onload=True), weights=FakeWeights(delay_s=0.1))
        await m.offload()
        await asyncio.gather(*(hold(m, 0.01) for _ in range(10)))
        assert w.moves == ["offload", "onload"] and m.state == "resident"
        assert m.describe()["last_onload"]["reason"] == "request"

    asyncio.run(go())


def test_auto_onload_failure_is_a_503_for_the_request():
    async def go():
        m, w = machine(LifecyclePolicy(auto_onload=True))
        await m.offload()
        w.fail_onloads = 1
        with pytest.raises(ServeError) as err:
            async with m.admit():
                pass
        assert err.value.code == "onload_failed" and m.state == "offloaded" and m.in_flight == 0
        async with m.admit():  # the retry onloads
            pass
        assert m.state == "resident"

    asyncio.run(go())


def test_per_call_onloads_per_window_and_offloads_when_idle():
    async def go():
        m, w = machine(LifecyclePolicy(residency="per_call", idle_offload_s=0.1))
        await m.start_offloaded()
        for _ in range(2):
            await asyncio.gather(*(hold(m, 0.02) for _ in range(5)))  # one window
            assert m.state == "resident"
            await until(lambda: m.state == "offloaded")
        assert w.moves == ["offload", "onload", "offload", "onload", "offload"]
        assert m.describe()["last_offload"]["reason"] == "idle"

    asyncio.run(go())


def test_per_call_does_not_offload_while_requests_keep_coming():
    async def go():
        # requests 0.01 s apart against a 2 s idle window: a loaded machine's late wake-ups
        # stay far inside it
        m, w = machine(LifecyclePolicy(residency="per_call", idle_offload_s=2.0))
        for _ in range(6):
            await hold(m, 0.01)
            await asyncio.sleep(0.01)
        assert w.moves == [] and m.state == "resident"
        await until(lambda: w.moves == ["offload"])
        m.close()

    asyncio.run(go())


def test_on_demand_starts_offloaded_and_stays_after_the_first_request():
    async def go():
        m, w = machine(LifecyclePolicy(residency="on_demand"))
        await m.start_offloaded()
        assert m.state == "offloaded"
        await hold(m, 0.01)
        await asyncio.sleep(0.2)
        assert m.state == "resident" and w.moves == ["offload", "onload"]

    asyncio.run(go())


def test_policy_validation():
    assert LifecyclePolicy().onloads_on_request is False
    assert LifecyclePolicy(residency="per_call").idle_s == 1.0
    assert LifecyclePolicy(residency="on_demand").idle_s is None
    assert LifecyclePolicy(residency="on_demand").onloads_on_request is True
    for bad in (
        {"residency": "sometimes"},
        {"residency": "per_call", "auto_onload": False},
        {"idle_offload_s": 3},  # resident
        {"residency": "per_call", "idle_offload_s": -1},
        {"auto_onload": "yes"},
    ):
        with pytest.raises(ConfigError):
            LifecyclePolicy(**bad)


def test_the_policy_is_derived_from_the_typed_spec_and_checked_at_its_key():
    from rewardplane.serve.config import config_from_dict
    from rewardplane.serve.residency import policy_of

    spec = {"name": "len", "kind": "length", "residency": "per_call", "idle_offload_s": 0.5}
    (scorer,) = config_from_dict({"scorers": [spec]}).scorers
    assert policy_of(scorer) == LifecyclePolicy(residency="per_call", idle_offload_s=0.5)
    assert policy_of(scorer).idle_s == 0.5 and policy_of(scorer).onloads_on_request
    with pytest.raises(ConfigError, match=r"scorers\[0\].*auto_onload cannot be false"):
        config_from_dict({"scorers": [{**spec, "auto_onload": False}]})
    with pytest.raises(ConfigError, match=r"scorers\[0\]\.idle_offload_s"):
        config_from_dict({"scorers": [{**spec, "idle_offload_s": float("inf")}]})


def test_many_scorers_select_unknown_and_partial_failure():
    async def go():
        lc = Lifecycle()
        a, wa = machine()
        a.name = "a"
        b, wb = machine()
        b.name = "b"
        lc.add(a)
        lc.add(b)
        with pytest.raises(ServeError) as err:
            lc.select(["a", "nope"])
        assert err.value.code == "unknown_scorer"
        out = await lc.offload()
        assert set(out) == {"a", "b"} and lc.states() == {"a": "offloaded", "b": "offloaded"}
        wb.fail_onloads = 1
        with pytest.raises(ServeError) as err:
            await lc.onload()
        assert err.value.code == "onload_failed" and "'b'" in err.value.message
        assert lc.states() == {"a": "resident", "b": "offloaded"}
        assert (await lc.onload(["b"]))["b"]["changed"]
        assert lc.states() == {"a": "resident", "b": "resident"}

    asyncio.run(go())


def test_many_weights_move_all_or_nothing():
    """A composite's inline models: one onload that fails puts the ones already moved back."""
    from rewardplane.serve.weights import ManyWeights

    a, b = FakeWeights(100), FakeWeights(20)
    both = ManyWeights([a, b])
    assert both.offload() == {"bytes": 120} and not a.on_device and not b.on_device
    b.fail_onloads = 1
    with pytest.raises(RuntimeError, match="onload needs"):
        both.onload()
    assert not a.on_device and not b.on_device  # a moved, then went back: still all offloaded
    assert a.moves == ["offload", "onload", "offload"]
    assert both.onload() == {"bytes": 120} and a.on_device and b.on_device
    assert ManyWeights([]).offload() == {"bytes": 0}
