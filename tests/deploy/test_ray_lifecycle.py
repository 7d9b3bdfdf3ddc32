"""Lifecycle under `--backend ray`: every replica's own state machine, driven by broadcast.

The merge and failure rules are checked against stand-in handles (fast, no Ray); the HTTP
contract through the real app over a local CPU Ray Serve, with two replicas of a torch scorer.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from rewardplane.deploy.ray_lifecycle import MIXED, RayLifecycle, merge_results, merge_states
from rewardplane.serve.protocol import ServeError


def described(state, *, at=1.0, bytes_on_device=0, error=None, transitions=1):
    return {
        "state": state,
        "residency": "resident",
        "auto_onload": False,
        "idle_offload_s": None,
        "in_flight": 0,
        "bytes_on_device": bytes_on_device,
        "bytes_total": 100,
        "since": at,
        "last_transition": {"resident": 0.5, state: at},
        "transitions": transitions,
        "last_offload": {"bytes": 100, "at": at} if state == "offloaded" else None,
        "last_onload": None,
        "last_error": error,
    }


def test_merged_state_sums_replicas_and_says_mixed_when_they_differ():
    same = merge_states({"r1": described("offloaded", at=2.0), "r2": described("offloaded", at=3.0)})
    assert same["state"] == "offloaded" and same["bytes_total"] == 200 and same["transitions"] == 2
    assert same["since"] == 3.0 and same["last_offload"] == {"bytes": 100, "at": 3.0}
    assert set(same["replicas"]) == {"r1", "r2"} and same["last_error"] is None
    mixed = merge_states(
        {"r1": described("resident", bytes_on_device=100), "r2": described("offloaded", error="oom")}
    )
    assert mixed["state"] == MIXED and mixed["bytes_on_device"] == 100 and mixed["last_error"] == "r2: oom"


def test_merged_result_changed_if_any_replica_moved():
    out = merge_results(
        "offload",
        {
            "r1": {
                "action": "offload",
                "changed": True,
                "state": "offloaded",
                "transfer": {"bytes": 7, "seconds": 0.2},
            },
            "r2": {"action": "offload", "changed": False, "state": "offloaded"},
        },
    )
    assert out["changed"] is True and out["state"] == "offloaded"
    assert out["transfer"] == {"bytes": 7, "seconds": 0.2, "replicas": 1}
    drain = merge_results(
        "drain",
        {
            "r1": {"action": "drain", "changed": True, "state": "draining", "drained": True, "in_flight": 0},
            "r2": {"action": "drain", "changed": True, "state": "draining", "drained": False, "in_flight": 2},
        },
    )
    assert drain["drained"] is False and drain["in_flight"] == 2


class Broadcast:
    def __init__(self, outs):
        self.outs = outs

    async def results_async(self, *, timeout_s, return_exceptions):
        return self.outs


class FakeHandle:
    """Answers a broadcast as each of its replicas would; records the calls in order."""

    def __init__(self, replicas):
        self.replicas = replicas  # replica id -> callable(action, timeout_s) -> answer
        self.calls = []

    def broadcast(self, method, *args):
        self.calls.append((method, *args))
        return Broadcast([answer(*args) for answer in self.replicas.values()])


def ok(replica, state, changed=True):
    return lambda action, timeout_s: {
        "replica": replica,
        "pid": 1,
        "result": {"action": action, "changed": changed, "state": state},
    }


def test_a_failing_replica_fails_the_action_with_its_code_and_names_it():
    failed = {
        "code": "onload_failed",
        "message": "scorer 'rm': onload failed: out of memory",
        "retry_after": 1.0,
    }
    handle = FakeHandle(
        {
            "r1": ok("r1", "resident"),
            "r2": lambda action, timeout_s: {
                "replica": "r2",
                "pid": 2,
                "state": "offloaded",
                "error": failed,
            },
        }
    )
    lc = RayLifecycle({"rm": handle}, ["rm", "len"], request_timeout_s=5.0)

    async def go():
        with pytest.raises(ServeError) as err:
            await lc.action("onload", ["rm"], None)
        assert err.value.code == "onload_failed" and err.value.retry_after == 1.0
        assert "replica r2" in err.value.message and "'r1': 'resident'" in err.value.message
        assert lc.states["rm"] == MIXED
        with pytest.raises(ServeError) as err:
            await lc.action("onload", ["nope"], None)
        assert err.value.code == "unknown_scorer"
        with pytest.raises(ServeError) as err:  # "len" has no deployment: not ready, nothing sent
            await lc.action("offload", ["len"], None)
        assert err.value.code == "not_ready"

    asyncio.run(go())


def test_concurrent_actions_reach_every_replica_in_the_same_order():
    order: dict[str, list[str]] = {"r1": [], "r2": []}
    begun = [0]

    async def answer(name, delay_s, action, timeout_s):
        await asyncio.sleep(delay_s)
        order[name].append(action)
        return {"replica": name, "pid": 1, "result": {"action": action, "changed": True, "state": "resident"}}

    class AsyncBroadcast:
        async def results_async(self, *, timeout_s, return_exceptions):
            return await asyncio.gather(*self.answers)

    class AsyncHandle:
        def broadcast(self, method, *args):
            # r2 answers each later broadcast faster: unserialised, it would apply them reversed
            begun[0] += 1
            b = AsyncBroadcast()
            b.answers = [answer("r1", 0.0, *args), answer("r2", 0.05 / begun[0], *args)]
            return b

    lc = RayLifecycle({"rm": AsyncHandle()}, ["rm"], request_timeout_s=5.0)

    async def go():
        actions = ["offload", "onload", "drain", "offload", "drain", "onload"]
        await asyncio.gather(*(lc.action(a, ["rm"], None) for a in actions))
        assert order["r1"] == actions and order["r2"] == actions

    asyncio.run(go())


# --- the HTTP contract through the real app over local Ray Serve ----------------------------------

ITEMS = [{"id": f"i{k}", "prompt": "Say hello.", "response": "Hello there" + "!" * k} for k in range(4)]


@pytest.mark.slow
def test_ray_http_lifecycle_on_every_replica(ray_env):
    pytest.importorskip("ray.serve")
    import ray
    from ray import serve

    from rewardplane.deploy.config import parse_deploy_config
    from rewardplane.deploy.launch import service_config
    from rewardplane.deploy.ray_backend import RayBackend
    from support.deploy_fakes import CPU
    from support.serve import LiveServer

    doc = {
        "mode": "shared",
        "imports": ["support.deploy_fakes"],
        "ray": {"temp_dir": ray_env, "num_cpus": 0.1, "log_to_driver": False},
        "scorers": [
            {"name": "rm", "kind": "hf_seqcls", "shape": "tiny-text-rm", "device": "cpu", "num_replicas": 2},
            {"name": "len", "kind": "length"},
            {"name": "auto", "kind": "rk_test_sleep", "auto_onload": True},
        ],
    }
    deploy = parse_deploy_config(doc, CPU)
    # started here, on the main thread (ray.init installs signal handlers); the backend joins it
    start_local_ray(ray, ray_env)
    backend = RayBackend(deploy, health_poll_s=0.2)
    try:
        # two replicas of a torch scorer each import torch and warm up: on two busy cores the
        # deployment took over 240 s; LiveServer waits for /health/ready (failing at once on a
        # failed scorer), this is only the ceiling
        with LiveServer(service_config(deploy), backend=backend, ready_timeout_s=900) as server:
            _check_http_contract(server)
    finally:
        serve.shutdown()
        ray.shutdown()


def start_local_ray(ray, temp_dir: str, attempts: int = 3) -> None:
    """`ray.init` of a local instance, tried again when its raylet misses Ray's fixed 30 s to
    register (on two busy cores it did): Ray's own start-up budget, not something under test."""
    for attempt in range(attempts):
        try:
            ray.init(
                namespace="rewardplane", _temp_dir=temp_dir, include_dashboard=False, log_to_driver=False
            )
            return
        except Exception as exc:
            ray.shutdown()
            if "timed out during startup" not in str(exc) or attempt == attempts - 1:
                raise


def _check_http_contract(server):
    url = server.url

    def act(action, scorer=None, **kw):
        params = {"scorer": scorer} if scorer else None
        return httpx.post(f"{url}/v1/lifecycle/{action}", params=params, timeout=120, **kw)

    def score(scorer):
        return httpx.post(f"{url}/v1/score", json={"scorers": [scorer], "items": ITEMS}, timeout=120)

    def ready():
        r = httpx.get(url + "/health/ready", timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["scorers"]

    def lifecycle():
        r = httpx.get(url + "/v1/lifecycle", timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    first = [x["scores"]["rm"] for x in score("rm").json()["results"]]
    state = lifecycle()
    rm = state["scorers"]["rm"]
    assert rm["state"] == "resident" and len(rm["replicas"]) == 2 and rm["bytes_total"] > 0
    assert rm["bytes_total"] == sum(r["bytes_total"] for r in rm["replicas"].values())
    assert sum(p.startswith("rm/") for p in state["processes"]) == 2  # one entry per replica process

    for _ in range(2):
        r = act("offload", "rm")
        assert r.status_code == 200, r.text
        out = r.json()["results"]["rm"]
        assert out["changed"] is True and out["state"] == "offloaded" and out["transfer"]["bytes"] > 0
        assert len(out["replicas"]) == 2 and all(x["changed"] for x in out["replicas"].values())
        rm = r.json()["lifecycle"]["scorers"]["rm"]
        assert rm["state"] == "offloaded" and rm["bytes_on_device"] == 0
        again = act("offload", "rm")
        assert again.status_code == 200 and again.json()["results"]["rm"]["changed"] is False
        for _ in range(6):  # whichever replica a request reaches: 503 offloaded at once
            refused = score("rm")
            assert refused.status_code == 503 and refused.json()["code"] == "offloaded", refused.text
            assert refused.headers["retry-after"] == "1"
        assert score("len").status_code == 200  # the others are untouched
        assert ready() == {"rm": "offloaded", "len": "ready", "auto": "ready"}
        r = act("onload", "rm")
        assert r.status_code == 200 and r.json()["results"]["rm"]["state"] == "resident", r.text
        assert [x["scores"]["rm"] for x in score("rm").json()["results"]] == first  # bit for bit

    # concurrent actions are serialised: the replicas end in one state, never mixed
    with ThreadPoolExecutor(6) as pool:
        answers = list(
            pool.map(lambda a: act(a, "rm"), ["offload", "onload", "drain", "onload", "offload", "onload"])
        )
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    # whichever action ran last decides the state (drain last, on a resident scorer, leaves it
    # draining; on an offloaded one it is a no-op); what must never happen is replicas that differ
    assert lifecycle()["scorers"]["rm"]["state"] in ("resident", "offloaded", "draining")
    assert act("onload", "rm").json()["results"]["rm"]["state"] == "resident"

    # the whole server: drain refuses new work with 503 draining, onload reopens every scorer
    r = act("drain", json={"timeout_s": 10})
    assert r.status_code == 200 and {v["state"] for v in r.json()["results"].values()} == {"draining"}
    assert ready() == {"rm": "draining", "len": "draining", "auto": "draining"}
    drained = score("len")
    assert drained.status_code == 503 and drained.json()["code"] == "draining"
    assert act("onload").status_code == 200
    assert ready() == {"rm": "ready", "len": "ready", "auto": "ready"}

    # auto_onload: a request that finds the scorer offloaded onloads it instead of a 503
    assert act("offload", "auto").json()["results"]["auto"]["state"] == "offloaded"
    assert ready()["auto"] == "offloaded"
    assert score("auto").status_code == 200
    deadline = time.monotonic() + 120  # the backend's poll hears the replica's own move (a ceiling)
    while ready()["auto"] != "ready":
        assert time.monotonic() < deadline, ready()
        time.sleep(0.1)
    assert lifecycle()["scorers"]["auto"]["state"] == "resident"

    bad = act("offload", "nope")
    assert bad.status_code == 422 and bad.json()["code"] == "unknown_scorer"
