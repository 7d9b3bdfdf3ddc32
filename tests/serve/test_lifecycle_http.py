"""Lifecycle's HTTP contract through a real app and the client, on the CPU (offload, onload, drain,
residency, the token); one GPU test for memory and CUDA graphs. The state machine itself is
tests/serve/test_lifecycle.py."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

import httpx
import pytest

from support.serve import LiveServer, make_config

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
        deadline = time.monotonic() + 30  # admitted, not merely sent: a loaded machine is slow to send
        while state(server)["scorers"]["d"].get("in_flight", 0) == 0 and not in_flight.done():
            assert time.monotonic() < deadline, "the first request never reached the scorer"
            time.sleep(0.01)
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
        until_call_offloaded(s)
        states = {n: v["state"] for n, v in state(s)["scorers"].items()}
        assert states == {"auto": "resident", "call": "offloaded", "lazy": "offloaded"}
        first = score(s, ["auto"]).json()
        act(s, "offload", {"scorer": "auto"})
        onloaded = state(s)["scorers"]["call"]["last_onload"]
        again = score(s, ["auto", "call", "lazy"])  # each onloads on the way in
        assert again.status_code == 200, again.text
        assert [x["scores"]["auto"] for x in again.json()["results"]] == [
            x["scores"]["auto"] for x in first["results"]
        ]
        assert all(not x["errors"] for x in again.json()["results"])
        # `call` may already be idle again (0.3 s) by the time a loaded machine asks: its onload
        # for this request is what is checked, its state only once it has offloaded itself
        after = state(s)["scorers"]
        assert after["auto"]["state"] == after["lazy"]["state"] == "resident"
        assert after["call"]["last_onload"] not in (None, onloaded), after["call"]
        until_call_offloaded(s)
        states = {n: v["state"] for n, v in state(s)["scorers"].items()}
        assert states == {"auto": "resident", "call": "offloaded", "lazy": "resident"}
        assert state(s)["scorers"]["call"]["last_offload"]["reason"] == "idle"


def until_call_offloaded(s, ceiling_s=120.0):
    """Until the per_call scorer `call` has offloaded itself (idle_offload_s 0.3): the condition,
    with a ceiling for a starved machine."""
    deadline = time.monotonic() + ceiling_s
    while state(s)["scorers"]["call"]["state"] != "offloaded":
        assert time.monotonic() < deadline, state(s)["scorers"]["call"]
        time.sleep(0.05)


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
