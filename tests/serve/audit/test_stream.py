"""The audit stream on the request path: it never delays or fails a proxy response, drops and
counts under load (by items and by bytes), reads versions as documented, samples groups whole,
and scores with hosted or external auditors."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from prometheus_client import CollectorRegistry

from rewardplane.serve.audit.config import AuditConfig
from rewardplane.serve.audit.metrics import AuditMetrics
from rewardplane.serve.audit.stream import AuditStream
from rewardplane.serve.scorers.base import ItemError, ScoreItem
from support.serve import LiveServer, make_config

SLOW_S = 0.6


def post(url: str, items: list[dict], scorers: list[str] | None = None) -> httpx.Response:
    return httpx.post(f"{url}/v1/score", json={"scorers": scorers or ["len"], "items": items}, timeout=30)


def batch(version: int, n: int = 50, text: str = "a response") -> list[dict]:
    return [{"id": str(i), "prompt": "p", "response": f"{text} {i}", "metadata": {"policy_version": version}}
            for i in range(n)]  # fmt: skip


def test_a_slow_auditor_never_delays_the_proxy_and_overflow_is_dropped_and_counted():
    config = make_config(
        [{"name": "len", "kind": "length"},
         {"name": "slow", "kind": "double", "max_batch_size": 4, "options": {"sleep_s": SLOW_S}}],
        audit={"proxy": "len", "auditors": ["slow"], "sample": 1.0, "queue": 8, "batch_size": 4},
    )  # fmt: skip
    with LiveServer(config) as server:
        latencies = []
        for v in range(12):
            started = time.perf_counter()
            response = post(server.url, batch(v))
            latencies.append(time.perf_counter() - started)
            assert response.status_code == 200
            assert response.json()["results"][3]["scores"]["len"] == len("a response 3")
        audit = httpx.get(f"{server.url}/v1/audit", params={"summary": "true"}).json()
    # 600 items offered to an auditor that takes 0.6 s per 4, its queue full after the first
    # request: a response that waited for it would take a batch's 0.6 s, every one after the
    # first. The median and the mean say they did not (one scheduler stall on a starved machine
    # is not a wait for the auditor; every response waiting would be)
    assert sorted(latencies)[len(latencies) // 2] < SLOW_S / 2, latencies
    assert sum(latencies) < len(latencies) * SLOW_S / 2, latencies
    counts = audit["counts"]
    assert counts["sampled"] == 600 and counts["dropped_queue_full"] >= 500
    assert audit["queue_depth"] <= 8
    in_flight = counts["sampled"] - counts["dropped_queue_full"] - counts["audited"] - audit["queue_depth"]
    assert 0 <= in_flight <= 4  # at most one batch being scored; nothing else unaccounted for


async def _stream(config: AuditConfig, backend) -> AuditStream:
    stream = AuditStream(config, backend)
    await stream.start()
    return stream


class EchoBackend:
    """Scores `gold` as len(response); records how many items it was asked for."""

    def __init__(self, fail: bool = False) -> None:
        self.seen = 0
        self.batches: list[int] = []
        self.fail = fail

    async def score(self, name: str, items: list[ScoreItem]) -> list:
        self.seen += len(items)
        self.batches.append(len(items))
        if self.fail:
            raise RuntimeError("auditor down")
        return [float(len(str(i.response))) if "ERR" not in str(i.response) else ItemError("bad_input", "x")
                for i in items]  # fmt: skip


def item(i: int, meta: dict | None, response: str = "text", group: str | None = None) -> ScoreItem:
    return ScoreItem(str(i), "p", response, group_id=group, metadata=meta)


def run(coro):
    return asyncio.run(coro)


def test_the_queue_is_bounded_by_bytes_too():
    async def go():
        config = AuditConfig(proxy="rm", auditors=["gold"], batch_wait_s=0, sample=1.0, queue_bytes=4096)
        stream = await _stream(config, EchoBackend())
        big = [item(i, {"policy_version": 0}, "x" * 3000) for i in range(5)]
        stream.observe(["rm"], big, {"rm": [1.0] * 5})
        await stream.drain()
        await stream.stop()
        return stream.counts

    counts = run(go())
    assert counts["sampled"] == 5 and counts["dropped_queue_bytes"] >= 4


def test_versions_are_read_as_documented_and_a_bad_one_never_raises():
    async def go(**settings):
        config = AuditConfig(proxy="rm", auditors=["gold"], batch_wait_s=0, sample=1.0, **settings)
        stream = await _stream(config, EchoBackend())
        metas = [{"policy_version": 3}, {"policy_version": "4"}, {"policy_version": 5.0}, {"policy_version": -1},
                 {"policy_version": "v7"}, {"policy_version": True}, None, {"other": 1}]  # fmt: skip
        items = [item(i, m) for i, m in enumerate(metas)]
        stream.observe(["rm", "x"], items, {"rm": [1.0] * len(items), "x": [0.0] * len(items)})
        stream.observe(["x"], items, {"x": [0.0] * len(items)})  # no proxy result: nothing offered
        stream.observe(
            ["rm"], items[:2], {"rm": [float("nan"), ItemError("bad_input", "no")]}
        )  # errors: skipped
        stream.observe(["rm"], items, {"rm": None})  # a malformed result is logged, never raised
        await stream.drain()
        await stream.stop()
        return stream

    stream = run(go())
    assert stream.counts == {"sampled": 3, "bad_version": 3, "unversioned": 2, "audited": 3}
    assert sorted(stream.ledger.versions) == [3, 4, 5]
    windowed = run(go(arrival_window=2))
    assert (
        windowed.counts["sampled"] == 5
        and "unversioned" not in windowed.counts
        and sorted(windowed.ledger.versions) == [0, 3, 4, 5]
    )


def test_a_group_is_sampled_whole():
    async def go():
        config = AuditConfig(
            proxy="rm", auditors=["gold"], batch_wait_s=0, sample=0.5, seed=3, boost={"factor": 1}
        )
        stream = await _stream(config, EchoBackend())
        items = [item(i, {"policy_version": 0}, group=f"g{i // 4}") for i in range(400)]
        stream.observe(["rm"], items, {"rm": [1.0] * 400})
        await stream.drain()
        await stream.stop()
        return stream

    stream = run(go())
    kept = stream.counts["sampled"]
    assert kept % 4 == 0 and 100 < kept < 300


def test_auditor_failures_are_counted_and_never_recorded_as_scores():
    async def go(fail: bool):
        config = AuditConfig(proxy="rm", auditors=["gold"], batch_wait_s=0, sample=1.0)
        stream = await _stream(config, EchoBackend(fail=fail))
        items = [item(i, {"policy_version": 0}, "ERR" if i % 2 else "ok") for i in range(10)]
        stream.observe(["rm"], items, {"rm": [1.0] * 10})
        await stream.drain()
        await stream.stop()
        return stream

    partial = run(go(fail=False))
    assert partial.counts["audited"] == 5 and partial.counts["auditor_failed"] == 5
    assert partial.auditor_errors == {"gold": 5}
    down = run(go(fail=True))
    assert down.counts["auditor_failed"] == 10 and "audited" not in down.counts and down.ledger.versions == {}


def test_an_external_auditor_is_another_services_scorer():
    with LiveServer(make_config([{"name": "ref", "kind": "length"}])) as other:
        config = make_config(
            [{"name": "len", "kind": "length"}],
            audit={"proxy": "len", "auditors": [{"url": other.url, "scorer": "ref", "name": "big"}],
                   "sample": 1.0, "min_items": 10, "batch_wait_s": 0},
        )  # fmt: skip
        with LiveServer(config) as server:
            for v in range(3):
                assert post(server.url, batch(v, 20)).status_code == 200
            deadline = time.monotonic() + 120
            while (body := httpx.get(f"{server.url}/v1/audit").json())["counts"]["audited"] < 60:
                assert time.monotonic() < deadline, body["counts"]
                time.sleep(0.05)
    assert body["auditors"] == ["big"] and body["auditor_errors"] == {"big": 0}
    first = body["versions"][0]["auditors"]["big"]
    assert first["tau"]["point"] == pytest.approx(1.0) and first["failed"] == 0


def test_a_worker_waits_to_fill_its_batch_so_the_auditor_runs_full_forwards():
    async def go(wait: float) -> list[int]:
        backend = EchoBackend()
        config = AuditConfig(proxy="rm", auditors=["gold"], sample=1.0, batch_size=8, batch_wait_s=wait)
        stream = await _stream(config, backend)
        for start in (0, 3):  # items trickle in: 3, then 5 a little later
            n = 3 if start == 0 else 5
            stream.observe(
                ["rm"], [item(start + i, {"policy_version": 0}) for i in range(n)], {"rm": [1.0] * n}
            )
            await asyncio.sleep(0.1)
        await stream.drain()
        await stream.stop()
        return backend.batches

    assert run(go(wait=5.0)) == [8]
    assert run(go(wait=0.0)) == [3, 5]


def test_audit_json_is_written_on_a_throttle_and_nothing_recorded_is_lost(tmp_path, monkeypatch):
    import json

    import rewardplane.serve.audit.stream as module

    monkeypatch.setattr(module, "WRITE_EVERY_S", 3600.0)  # after the first write, only drain/stop write
    writes = []
    write = module.AuditStream._write
    monkeypatch.setattr(module.AuditStream, "_write", lambda self, out: (writes.append(1), write(self, out)))

    def on_file() -> dict:
        return json.loads((tmp_path / "audit.json").read_text())

    async def go():
        config = AuditConfig(proxy="rm", auditors=["gold"], batch_wait_s=0, batch_size=5, sample=1.0,
                             min_items=5, settle_versions=1, out=str(tmp_path))  # fmt: skip
        stream = await _stream(config, EchoBackend())
        for v in range(8):
            stream.observe(["rm"], [item(i, {"policy_version": v}) for i in range(5)], {"rm": [1.0] * 5})
            await asyncio.sleep(0)
        await stream.drain()
        first = (len(writes), on_file(), len(stream.ledger.bins))
        for v in range(8, 12):
            stream.observe(["rm"], [item(i, {"policy_version": v}) for i in range(5)], {"rm": [1.0] * 5})
        while stream.counts.get("audited", 0) < 60:  # recorded, not yet written (the throttle)
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        before_stop = on_file()
        await stream.stop()
        return stream, first, before_stop

    stream, (n_writes, drained, n_bins), before_stop = run(go())
    assert n_bins == 7 and len(drained["bins"]) == 7  # at drain the file has every closed bin
    assert n_writes <= 3  # 7 bins closed: the first write, maybe one racing the drain, the drain's
    assert len(before_stop["bins"]) == 7  # four more versions recorded, throttled
    final = on_file()  # stop wrote them
    assert len(final["bins"]) == len(stream.ledger.bins) == 11
    assert [v["version"] for v in final["versions"]] == list(range(12))
    assert final["bins"] == json.loads(json.dumps(module.clean(stream.ledger.bins)))


def test_an_epoch_starts_boosted_calm_bins_bring_the_base_rate_and_a_restart_boosts_again():
    """Adaptive sampling: every epoch starts at `sample` × `factor` (its first windows are what
    every later comparison reads), drops to `sample` once `hold_bins` bins were decided with
    nothing moving, and a restart (a new epoch) starts boosted again; `GET /v1/audit`'s
    `sample_rate` and the sampled counts say which."""
    import random

    async def go():
        config = AuditConfig(proxy="rm", auditors=["gold"], batch_wait_s=0, sample=0.25, min_items=30,
                             restart_gap_s=0.05, boost={"factor": 4, "hold_bins": 2})  # fmt: skip
        registry = CollectorRegistry()
        stream = AuditStream(config, EchoBackend(), AuditMetrics(registry))
        await stream.start()
        rng = random.Random(7)
        sampled_at: list[int] = []

        def gauge() -> float | None:  # what /metrics would say
            return registry.get_sample_value("rewardplane_audit_sample_rate")

        async def version(v: int) -> None:
            before = stream.counts.get("sampled", 0)
            items = [item(i, {"policy_version": v}, "x " * rng.randint(1, 30), group=f"{v}-{i // 8}")
                     for i in range(64)]  # fmt: skip
            stream.observe(["rm"], items, {"rm": [rng.random() for _ in items]})
            await stream.drain()
            sampled_at.append(stream.counts.get("sampled", 0) - before)

        assert stream.sampler.rate == 1.0 and gauge() == 1.0
        for v in range(60):
            await version(v)
        calm = (await stream.snapshot(summary=True))["sample_rate"], gauge()
        decided = len(stream.ledger.alarms["overoptimization"]["gold"]["fired_bins"])
        await asyncio.sleep(0.1)
        await version(0)  # a restart from a checkpoint: version 0 again after a pause
        restarted = stream.sampler.rate, stream.sampler.epoch, gauge()
        await stream.stop()
        return sampled_at, calm, decided, restarted

    sampled_at, calm, decided, restarted = run(go())
    assert decided == 0  # nothing moves here: no alarm, so nothing holds the boost
    assert sampled_at[:6] == [64] * 6  # boosted: every group of the first versions
    assert calm == (0.25, 0.25) and sum(sampled_at[-20:]) < 0.45 * 20 * 64  # the base rate, ~16 a version
    assert restarted == (1.0, 1, 1.0) and sampled_at[-1] == 64  # the gauge says so before any bin closes
