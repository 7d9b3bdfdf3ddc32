"""`rewardplane serve --deploy`: the serve app over the gateway, and GET /v1/deployment."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from rewardplane.cli import main
from rewardplane.deploy.config import DeviceProbe
from rewardplane.deploy.launch import deploy_backend
from rewardplane.serve.app import create_app
from rewardplane.serve.backend import InProcessBackend
from rewardplane.serve.config import config_from_dict
from support.serve import hold_the_port

CPU = DeviceProbe(cuda_available=False, gpu_count=0, control_binary=None)


def test_http_api_over_workers(tmp_path):
    path = tmp_path / "deploy.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "mode": "shared",
                "token": "s3cret",
                "imports": ["support.deploy_fakes"],
                "scorers": [
                    {"name": "a", "kind": "rk_test_sleep", "options": {"delay_s": 0.3}},
                    {"name": "len", "kind": "length"},
                    {"name": "em", "kind": "exact_match"},
                ],
            }
        )
    )
    backend, config = deploy_backend(path, probe=CPU)
    backend.settings.backoff_base_s = 3.0
    auth = {"authorization": "Bearer s3cret"}
    with TestClient(create_app(backend, config)) as client:
        deadline = time.monotonic() + 300
        while client.get("/health/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        item = {"id": "1", "prompt": "p", "response": "abc", "reference": "abc"}
        body = {"scorers": ["a", "len", "em"], "items": [item]}
        r = client.post("/v1/score", json=body, headers=auth)
        assert r.status_code == 200, r.text
        assert r.json()["results"][0]["scores"] == {"a": 3.0, "len": 3.0, "em": 1.0}

        assert client.get("/v1/deployment").status_code == 401
        dep = client.get("/v1/deployment", headers=auth).json()
        assert dep["mode"] == "shared" and dep["shared_fault_domain"] is True and dep["restarts"] == 0
        assert {w["name"]: w["state"] for w in dep["workers"]} == {
            "a": "ready",
            "len": "ready",
            "em": "ready",
        }
        assert dep["worker_gpu"] == {"a": None, "len": None, "em": None} and dep["mps"] is None

        os.kill(next(w["pid"] for w in dep["workers"] if w["name"] == "a"), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while client.get("/health/ready").status_code == 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        only_len = client.post("/v1/score", json={**body, "scorers": ["len"]}, headers=auth)
        assert only_len.status_code == 200 and "len" in only_len.json()["results"][0]["scores"]
        down = client.post("/v1/score", json=body, headers=auth)
        assert down.status_code == 503 and down.json()["code"] == "not_ready"


TIMED_SCORERS = [
    {"name": "slow", "kind": "rk_test_sleep", "max_batch_size": 8, "options": {"delay_s": 0.1}},
    {"name": "len", "kind": "length"},
]
BATCH_FAMILIES = (
    "rewardplane_batch_size",
    "rewardplane_queue_delay_seconds",
    "rewardplane_inference_seconds",
    "rewardplane_items",
)


def _batch_metrics(text):
    """Counts (and the batch-size sum) of the batcher's metrics, keyed by sample name and labels."""
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name in BATCH_FAMILIES:
            for s in family.samples:
                if s.name.endswith(("_count", "_total")) or s.name == "rewardplane_batch_size_sum":
                    out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _timed_requests(client):
    """Two sequential requests; returns their (queue ms, inference ms) headers and /metrics."""
    items = [{"id": str(k), "prompt": "p", "response": "x" * (k + 1)} for k in range(4)]
    timings = []
    for body in ({"scorers": ["slow", "len"], "items": items}, {"scorers": ["slow"], "items": items[:2]}):
        r = client.post("/v1/score", json=body)
        assert r.status_code == 200, r.text
        timings.append((float(r.headers["x-queue-time"]), float(r.headers["x-inference-time"])))
    return timings, _batch_metrics(client.get("/metrics").text)


def _wait_ready(client):
    deadline = time.monotonic() + 300
    while client.get("/health/ready").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_timing_headers_and_batch_metrics_match_in_process_mode(tmp_path):
    """Batching runs inside the workers; the gateway must still fill the headers and /metrics."""
    path = tmp_path / "deploy.yaml"
    path.write_text(
        yaml.safe_dump({"mode": "shared", "imports": ["support.deploy_fakes"], "scorers": TIMED_SCORERS})
    )
    backend, config = deploy_backend(path, probe=CPU)
    with TestClient(create_app(backend, config)) as client:
        _wait_ready(client)
        timings, metrics = _timed_requests(client)
        assert all(q > 0 for q, _ in timings) and all(i >= 100 for _, i in timings)  # the 0.1 s sleep

        # Concurrent requests share batches; every batch still reaches /metrics exactly once.
        one = {"scorers": ["slow"], "items": [{"id": i, "prompt": "p", "response": "abc"} for i in "cd"]}
        with ThreadPoolExecutor(4) as pool:
            assert all(
                r.status_code == 200 for r in pool.map(lambda _: client.post("/v1/score", json=one), range(4))
            )
        after = _batch_metrics(client.get("/metrics").text)
        key = ("rewardplane_batch_size_sum", (("scorer", "slow"),))
        assert after[key] == metrics[key] + 8
        assert after[("rewardplane_queue_delay_seconds_count", (("scorer", "slow"),))] == 6 + 8

    import support.deploy_fakes as deploy_fakes  # noqa: F401  (registers rk_test_sleep for the in-process run)

    service = config_from_dict({"scorers": TIMED_SCORERS})
    with TestClient(create_app(InProcessBackend(service), service)) as client:
        _wait_ready(client)
        in_process_timings, in_process_metrics = _timed_requests(client)
    assert all(q > 0 and i >= 100 for q, i in in_process_timings)
    assert metrics == in_process_metrics  # same series, same batch counts and sizes in both modes
    assert metrics[("rewardplane_batch_size_sum", (("scorer", "slow"),))] == 6
    assert metrics[("rewardplane_batch_size_count", (("scorer", "len"),))] == 1


def test_cli_refuses_config_and_deploy_together(tmp_path, capsys, monkeypatch):
    """Argument and file errors are answered before the port is tried: as if something held it."""
    hold_the_port(monkeypatch)
    for name in ("d.yaml", "c.yaml"):
        (tmp_path / name).write_text("scorers: []\n")
    assert main(["serve", "--deploy", str(tmp_path / "d.yaml"), "--config", str(tmp_path / "c.yaml")]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["serve", "--deploy", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
