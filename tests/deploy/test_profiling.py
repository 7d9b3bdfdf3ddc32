"""The opt-in worker profile window: configuration, the trace it writes, and a live worker's trace."""

from __future__ import annotations

import asyncio
import gzip
import json
import time

import pytest
import torch

from rewardplane.bench.trace import summarize_trace
from rewardplane.deploy.config import parse_deploy_config
from rewardplane.deploy.gateway import GatewayBackend
from rewardplane.deploy.profiling import (
    ENV_AFTER_BATCHES,
    ENV_DIR,
    ENV_SECONDS,
    ProfileWindow,
    profile_window,
)
from support.deploy_fakes import CPU, FAST, items


def test_window_is_off_unless_a_directory_is_set(tmp_path):
    assert ProfileWindow.from_env({}) is None
    w = ProfileWindow.from_env({ENV_DIR: str(tmp_path), ENV_AFTER_BATCHES: "3", ENV_SECONDS: "0.5"})
    assert w == ProfileWindow(tmp_path, 3, 0.5)
    assert ProfileWindow.from_env({ENV_DIR: str(tmp_path)}) == ProfileWindow(tmp_path, 20, 2.0)


@pytest.mark.parametrize(
    "extra", [{ENV_AFTER_BATCHES: "x"}, {ENV_AFTER_BATCHES: "-1"}, {ENV_SECONDS: "0"}, {ENV_SECONDS: "61"}]
)
def test_bad_window_settings_are_refused(tmp_path, extra):
    with pytest.raises(ValueError, match="REWARDPLANE_WORKER_PROFILE"):
        ProfileWindow.from_env({ENV_DIR: str(tmp_path), **extra})


def test_window_waits_for_the_batch_count_then_records_the_ops_that_ran(tmp_path):
    window = ProfileWindow(tmp_path / "traces", after_batches=5, seconds=0.3)
    served = {"n": 0}

    async def load():
        x = torch.randn(64, 64)
        while True:
            served["n"] += 1
            torch.mm(x, x)
            await asyncio.sleep(0.01)

    async def go():
        worker = asyncio.create_task(load())
        try:
            return await profile_window(window, lambda: served["n"], "w0")
        finally:
            worker.cancel()

    path = asyncio.run(go())
    assert path.parent == tmp_path / "traces" and path.name.startswith("w0-") and path.suffix == ".gz"
    assert not [p for p in path.parent.iterdir() if p != path]  # no staging leftovers
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    assert any(e.get("name") == "aten::mm" for e in events)
    summary = summarize_trace(path)
    assert summary["gpu"]["kernels"] == 0  # CPU only here: the summary says so, not a made-up busy time
    assert summary["window_ms"] > 0


def test_a_live_worker_writes_its_trace_after_serving_batches(tmp_path, monkeypatch):
    """Through the real supervisor: the env reaches the worker process, which counts batches."""
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    monkeypatch.setenv(ENV_AFTER_BATCHES, "2")
    monkeypatch.setenv(ENV_SECONDS, "0.3")
    doc = {
        "mode": "consolidated",
        "imports": ["support.deploy_fakes"],
        "scorers": [{"name": "fast", "kind": "rk_test_sleep", "max_batch_size": 8}],
    }
    gw = GatewayBackend(parse_deploy_config(doc, CPU), settings=FAST)

    async def go():
        await gw.start()
        try:
            # until the worker has written its trace (its export is CPU work: slow on a loaded
            # machine, where 40 quick tries ran out before it), with a ceiling
            deadline = time.monotonic() + 120
            while not list(tmp_path.glob("*.trace.json.gz")):
                assert time.monotonic() < deadline, "no trace written"
                assert await gw.score("fast", items(2)) == [1.0, 2.0]
                await asyncio.sleep(0.05)
        finally:
            await gw.stop()

    asyncio.run(go())
    traces = list(tmp_path.glob("*.trace.json.gz"))
    assert len(traces) == 1
    with gzip.open(traces[0], "rt") as f:
        assert json.load(f)["traceEvents"]
