"""Lifecycle through `--deploy`: the gateway forwards offload/onload/drain to each scorer's worker."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import yaml

from rewardplane.deploy.config import parse_deploy_config
from rewardplane.deploy.gateway import GatewayBackend
from rewardplane.deploy.launch import deploy_backend
from rewardplane.serve.config import config_from_dict
from rewardplane.serve.protocol import ServeError
from support.deploy_fakes import CPU, FAST, items
from support.serve import LiveServer


def test_gateway_forwards_lifecycle_to_the_scorer_worker_and_workers_stay_healthy():
    doc = {
        "mode": "shared",
        "imports": ["support.deploy_fakes"],
        "scorers": [
            {"name": "slow", "kind": "rk_test_sleep", "options": {"delay_s": 0.05}},
            {"name": "fast", "kind": "rk_test_sleep"},
        ],
    }
    gw = GatewayBackend(parse_deploy_config(doc, CPU), settings=FAST)

    async def go():
        await gw.start()
        try:
            assert await gw.score("slow", items(2)) == [1.0, 2.0]
            out = await gw.lifecycle_action("offload", ["slow"], None)
            assert out["slow"]["state"] == "offloaded" and out["slow"]["changed"] is True
            again = await gw.lifecycle_action("offload", ["slow"], None)
            assert again["slow"]["changed"] is False
            with pytest.raises(ServeError) as err:
                await gw.score("slow", items(1))
            assert err.value.code == "offloaded" and err.value.retry_after
            assert await gw.score("fast", items(1)) == [1.0]  # another worker, untouched
            state = await gw.lifecycle_state()
            assert {n: s["state"] for n, s in state["scorers"].items()} == {
                "slow": "offloaded",
                "fast": "resident",
            }
            assert len(state["processes"]) == 2  # one entry per worker
            await asyncio.sleep(FAST.health_interval_s * (FAST.unhealthy_checks + 1))
            assert all(w["state"] == "ready" for w in gw.deployment()["workers"])  # parked, not sick
            with pytest.raises(ServeError) as err:
                await gw.lifecycle_action("onload", ["nope"], None)
            assert err.value.code == "unknown_scorer"
            out = await gw.lifecycle_action("onload", None, None)
            assert {n: r["state"] for n, r in out.items()} == {"slow": "resident", "fast": "resident"}
            assert await gw.score("slow", items(2)) == [1.0, 2.0]
        finally:
            await gw.stop()

    asyncio.run(go())


def _parked_readiness(server) -> list[dict]:
    """/health/ready once a per_call scorer has offloaded itself when idle, then after an
    offload, a drain and onloads through HTTP: the bodies, in order."""
    bodies = []

    def post(action, scorer):
        r = httpx.post(f"{server.url}/v1/lifecycle/{action}", params={"scorer": scorer}, timeout=60)
        assert r.status_code == 200, r.text

    def ready():
        r = httpx.get(server.url + "/health/ready", timeout=10)
        assert r.status_code == 200, r.text  # parked on purpose: healthy
        return r.json()

    # per_call offloads itself after idle_offload_s; under --deploy the gateway hears it on a heartbeat
    deadline = time.monotonic() + 120
    while ready()["scorers"]["idle"] != "offloaded":
        assert time.monotonic() < deadline, ready()
        time.sleep(0.1)
    bodies.append(ready())
    post("offload", "slow")
    bodies.append(ready())
    refused = httpx.post(server.url + "/v1/score", json={"scorers": ["slow"], "items": ITEM}, timeout=30)
    assert refused.status_code == 503 and refused.json()["code"] == "offloaded"
    assert refused.headers["retry-after"] == "1"
    post("onload", "slow")
    post("drain", "slow")
    bodies.append(ready())
    post("onload", "slow")
    bodies.append(ready())
    return bodies


ITEM = [{"id": "1", "prompt": "p", "response": "abc"}]
PARKING_SCORERS = [
    {"name": "slow", "kind": "rk_test_sleep", "options": {"delay_s": 0.05}},
    {"name": "idle", "kind": "rk_test_sleep", "residency": "per_call", "idle_offload_s": 0.3},
]


def test_deploy_health_ready_lists_parked_scorers_like_config_mode(tmp_path):
    path = tmp_path / "deploy.yaml"
    path.write_text(
        yaml.safe_dump({"mode": "shared", "imports": ["support.deploy_fakes"], "scorers": PARKING_SCORERS})
    )
    backend, config = deploy_backend(path, probe=CPU)
    backend.settings.health_interval_s = 0.2
    with LiveServer(config, backend=backend) as server:
        deployed = _parked_readiness(server)
        assert all(w["state"] == "ready" for w in backend.deployment()["workers"])  # parked, not sick
    service = config_from_dict({"scorers": PARKING_SCORERS})
    with LiveServer(service) as server:
        in_process = _parked_readiness(server)
    assert deployed == in_process  # the same bodies in both modes
    assert [b["scorers"] for b in deployed] == [
        {"slow": "ready", "idle": "offloaded"},
        {"slow": "offloaded", "idle": "offloaded"},
        {"slow": "draining", "idle": "offloaded"},
        {"slow": "ready", "idle": "offloaded"},
    ]
