"""Lifecycle: the per-scorer state machine (offload, onload, drain, residency) and its HTTP contract
through a real app and the client, on the CPU; one GPU test for memory and CUDA graphs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import httpx
import pytest

from rewardplane.core.errors import ConfigError
from rewardplane.serve.errors import ServeError
from rewardplane.serve.lifecycle import (
    LIFECYCLE_ERROR_CODES,
    Lifecycle,
    LifecyclePolicy,
    ScorerLifecycle,
)
from support.serve import LiveServer, make_config


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
        t0 = time.perf_counter()
        with pytest.raises(ServeError) as err:
            async with m.admit():
                pass
        assert time.perf_counter() - t0 < 0.5
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
            await asyncio.sleep(0.3)
            assert m.state == "offloaded"
        assert w.moves == ["offload", "onload", "offload", "onload", "offload"]
        assert m.describe()["last_offload"]["reason"] == "idle"

    asyncio.run(go())


def test_per_call_does_not_offload_while_requests_keep_coming():
    async def go():
        m, w = machine(LifecyclePolicy(residency="per_call", idle_offload_s=0.15))
        for _ in range(6):
            await hold(m, 0.01)
            await asyncio.sleep(0.05)
        assert w.moves == [] and m.state == "resident"
        await asyncio.sleep(0.3)
        assert w.moves == ["offload"]
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


# --- the HTTP contract through a real app ---------------------------------------------------------

ITEMS = [{"id": f"i{k}", "prompt": "Say hello.", "response": "Hello there" + "!" * k} for k in range(6)]


def score(server, scorers, items=ITEMS, **kw):
    return httpx.post(server.url + "/v1/score", json={"scorers": scorers, "items": items}, timeout=30, **kw)


def act(server, action, params=None, body=None, **kw):
    kwargs = {"json": body} if body is not None else {}
    return httpx.post(server.url + f"/v1/lifecycle/{action}", params=params, timeout=60, **kwargs, **kw)


def state(server, **kw):
    r = httpx.get(server.url + "/v1/lifecycle", timeout=30, **kw)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def server():
    cfg = make_config(
        [
            {"name": "rm", "kind": "hf_seqcls", "shape": "tiny-text-rm", "device": "cpu"},
            {"name": "d", "kind": "double", "max_wait_ms": 1, "options": {"sleep_s": 0.3}},
            {"name": "len", "kind": "length"},
        ]
    )
    with LiveServer(cfg) as s:
        yield s


def rm_scores(server):
    r = score(server, ["rm"])
    assert r.status_code == 200, r.text
    return [x["scores"]["rm"] for x in r.json()["results"]]


def test_http_offload_onload_cycles_are_bit_exact_and_reported(server):
    first = rm_scores(server)
    for _ in range(3):
        r = act(server, "offload", {"scorer": "rm"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["action"] == "offload" and body["results"]["rm"]["changed"] is True
        assert body["results"]["rm"]["transfer"]["bytes"] > 0
        rm = body["lifecycle"]["scorers"]["rm"]
        assert rm["state"] == "offloaded" and rm["bytes_on_device"] == 0 and rm["bytes_total"] > 0
        assert {"resident", "draining", "offloading", "offloaded"} <= set(rm["last_transition"])
        assert "server" in body["lifecycle"]["processes"]
        again = act(server, "offload", {"scorer": "rm"})
        assert again.status_code == 200 and again.json()["results"]["rm"]["changed"] is False
        refused = score(server, ["rm"])
        assert refused.status_code == 503 and refused.json()["code"] == "offloaded"
        assert refused.headers["retry-after"] == "1"
        assert score(server, ["len"]).status_code == 200  # the others are untouched
        ready = httpx.get(server.url + "/health/ready", timeout=10)
        assert ready.status_code == 200 and ready.json()["scorers"]["rm"] == "offloaded"
        r = act(server, "onload", {"scorer": "rm"})
        assert r.status_code == 200 and r.json()["results"]["rm"]["state"] == "resident"
        assert r.json()["results"]["rm"]["ready_seconds"] >= 0
        assert rm_scores(server) == first  # bit for bit (JSON floats round-trip exactly)
    assert state(server)["scorers"]["rm"]["last_onload"]["bytes"] > 0


def test_http_whole_server_and_body_forms_and_bad_requests(server):
    r = act(server, "offload", body={"timeout_s": 10})
    assert r.status_code == 200, r.text
    assert {n: v["state"] for n, v in r.json()["results"].items()} == {
        "rm": "offloaded",
        "d": "offloaded",
        "len": "offloaded",
    }
    r = act(server, "onload", body={"scorers": ["rm", "d", "len"]})
    assert r.status_code == 200 and all(v["state"] == "resident" for v in r.json()["results"].values())
    for params, body, status, code in (
        ({"scorer": "nope"}, None, 422, "unknown_scorer"),
        ({"scorer": "rm"}, {"scorers": ["rm"]}, 422, "invalid_request"),
        (None, {"scorers": ["rm"], "extra": 1}, 422, "invalid_request"),
        ({"timeout_s": "soon"}, None, 422, "invalid_request"),
        ({"timeout_s": "-1"}, None, 422, "invalid_request"),
    ):
        r = act(server, "offload", params, body)
        assert r.status_code == status and r.json()["code"] == code, (params, body, r.text)
    r = httpx.post(server.url + "/v1/lifecycle/drain", content=b"{nope", timeout=10)
    assert r.status_code == 422 and r.json()["code"] == "invalid_json"
    assert state(server)["scorers"]["rm"]["state"] == "resident"


def test_http_drain_finishes_in_flight_and_refuses_new_work(server):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        in_flight = pool.submit(score, server, ["d"])
        time.sleep(0.1)
        drain = pool.submit(act, server, "drain", {"scorer": "d", "timeout_s": "10"})
        time.sleep(0.1)
        refused = score(server, ["d"])
        assert refused.status_code == 503 and refused.json()["code"] == "draining"
        assert refused.headers["retry-after"] == "1"
        done = in_flight.result(timeout=30)
        assert done.status_code == 200 and done.json()["results"][0]["scores"]["d"] == 11.0
        drained = drain.result(timeout=30)
    assert drained.status_code == 200, drained.text
    d = drained.json()["results"]["d"]
    assert (d["action"], d["changed"], d["state"], d["drained"], d["in_flight"]) == (
        "drain",
        True,
        "draining",
        True,
        0,
    )
    assert act(server, "onload", {"scorer": "d"}).json()["results"]["d"]["changed"] is True
    assert score(server, ["d"]).status_code == 200


def test_http_concurrent_transitions_are_serialised(server):
    first = rm_scores(server)
    actions = ["offload", "onload"] * 6 + ["offload"]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda a: act(server, a, {"scorer": "rm"}), actions))
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers if r.status_code != 200]
    final = state(server)["scorers"]["rm"]
    assert final["state"] in ("offloaded", "resident") and final["in_flight"] == 0
    assert (final["bytes_on_device"] == 0) == (final["state"] == "offloaded")
    act(server, "onload", {"scorer": "rm"})
    assert rm_scores(server) == first


def test_http_routes_need_the_token():
    cfg = make_config([{"name": "len", "kind": "length"}], token="t0k")
    with LiveServer(cfg, wait_ready=True) as s:
        assert act(s, "offload").status_code == 401
        assert httpx.get(s.url + "/v1/lifecycle", timeout=10).status_code == 401
        auth = {"authorization": "Bearer t0k"}
        assert act(s, "offload", headers=auth).status_code == 200
        assert state(s, headers=auth)["scorers"]["len"]["state"] == "offloaded"


def test_http_auto_onload_and_per_call_and_on_demand_residency():
    cfg = make_config(
        [
            {
                "name": "auto",
                "kind": "hf_seqcls",
                "shape": "tiny-text-rm",
                "device": "cpu",
                "auto_onload": True,
            },
            {
                "name": "call",
                "kind": "hf_seqcls",
                "shape": "tiny-text-rm",
                "device": "cpu",
                "residency": "per_call",
                "idle_offload_s": 0.3,
            },
            {"name": "lazy", "kind": "length", "residency": "on_demand"},
        ]
    )
    with LiveServer(cfg) as s:
        deadline = time.monotonic() + 10
        while state(s)["scorers"]["call"]["state"] != "offloaded" and time.monotonic() < deadline:
            time.sleep(0.05)
        states = {n: v["state"] for n, v in state(s)["scorers"].items()}
        assert states == {"auto": "resident", "call": "offloaded", "lazy": "offloaded"}
        first = score(s, ["auto"]).json()
        act(s, "offload", {"scorer": "auto"})
        again = score(s, ["auto", "call", "lazy"])  # each onloads on the way in
        assert again.status_code == 200, again.text
        assert [x["scores"]["auto"] for x in again.json()["results"]] == [
            x["scores"]["auto"] for x in first["results"]
        ]
        assert all(not x["errors"] for x in again.json()["results"])
        states = {n: v["state"] for n, v in state(s)["scorers"].items()}
        assert states == {"auto": "resident", "call": "resident", "lazy": "resident"}
        time.sleep(1.0)
        states = {n: v["state"] for n, v in state(s)["scorers"].items()}
        assert states == {"auto": "resident", "call": "offloaded", "lazy": "resident"}
        assert state(s)["scorers"]["call"]["last_offload"]["reason"] == "idle"


def test_client_offload_onload_and_resident_context(server):
    from rewardplane.serve.client import RewardClient

    first = rm_scores(server)
    with RewardClient(server.url) as client:
        out = client.offload(["rm"])
        assert out["rm"]["state"] == "offloaded"
        assert client.lifecycle()["scorers"]["rm"]["state"] == "offloaded"
        with client.resident(["rm"]):
            assert [r.scores["rm"] for r in client.score(ITEMS, ["rm"])] == first
        assert client.lifecycle()["scorers"]["rm"]["state"] == "offloaded"
        with pytest.raises(RuntimeError), client.resident(["rm"]):
            raise RuntimeError("the trainer's scoring phase failed")
        assert client.lifecycle()["scorers"]["rm"]["state"] == "offloaded"  # offloaded all the same
        assert client.onload()["rm"]["state"] == "resident"


def test_async_client_lifecycle(server):
    from rewardplane.serve.client import AsyncRewardClient

    async def go():
        async with AsyncRewardClient(server.url) as client:
            await client.offload(["rm"])
            async with client.resident(["rm"]):
                assert (await client.lifecycle())["scorers"]["rm"]["state"] == "resident"
            assert (await client.lifecycle())["scorers"]["rm"]["state"] == "offloaded"
            await client.onload(["rm"])

    asyncio.run(go())


@pytest.mark.gpu
def test_gpu_http_clip_graphs_memory_released_and_scores_bit_exact():
    """CLIP ViT-L/14 with CUDA graphs: offload returns its memory (NVML), onload re-captures."""
    import base64

    from rewardplane.models.offload import device_memory
    from support.serve import jpeg_bytes

    cfg = make_config(
        [
            {
                "name": "clip",
                "kind": "clip",
                "shape": "clip-vit-l-14",
                "dtype": "fp16",
                "device": "cuda",
                "max_batch_size": 8,
                "options": {"cuda_graphs": True},
            }
        ]
    )
    img = base64.b64encode(jpeg_bytes((64, 64))).decode()
    items = [{"id": f"c{k}", "prompt": f"a photo {k}", "image": {"b64": img}} for k in range(5)]

    def used() -> int:
        mem = device_memory("cuda")
        return mem.get("nvml_process_used_bytes", mem.get("nvml_device_used_bytes"))

    with LiveServer(cfg) as s:
        first = score(s, ["clip"], items).json()
        resident = used()
        total = state(s)["scorers"]["clip"]["bytes_total"]
        assert total > 500e6
        for _ in range(2):
            assert act(s, "offload").status_code == 200
            assert resident - used() > 0.9 * total
            r = act(s, "onload")
            assert r.status_code == 200, r.text
            assert r.json()["results"]["clip"]["transfer"]["gbps"] > 1
            assert score(s, ["clip"], items).json()["results"] == first["results"]


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
