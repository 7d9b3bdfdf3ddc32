"""Lifecycle through `--deploy`: the gateway forwards offload/onload/drain to each scorer's worker."""

from __future__ import annotations

import asyncio

import pytest

from rewardkit.deploy.config import parse_deploy_config
from rewardkit.deploy.gateway import GatewayBackend
from rewardkit.serve.errors import ServeError
from support.deploy_fakes import CPU, FAST, items


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
