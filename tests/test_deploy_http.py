"""`rewardkit serve --deploy`: the serve app over the gateway, and GET /v1/deployment."""

from __future__ import annotations

import os
import signal
import time

import yaml
from fastapi.testclient import TestClient

from rewardkit.cli import main
from rewardkit.deploy.config import DeviceProbe
from rewardkit.deploy.launch import deploy_backend
from rewardkit.serve.app import create_app

CPU = DeviceProbe(cuda_available=False, gpu_count=0, control_binary=None)


def test_http_api_over_workers(tmp_path):
    path = tmp_path / "deploy.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "mode": "shared",
                "token": "s3cret",
                "imports": ["deploy_fakes"],
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
        deadline = time.monotonic() + 60
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
        deadline = time.monotonic() + 10
        while client.get("/health/ready").status_code == 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        only_len = client.post("/v1/score", json={**body, "scorers": ["len"]}, headers=auth)
        assert only_len.status_code == 200 and "len" in only_len.json()["results"][0]["scores"]
        down = client.post("/v1/score", json=body, headers=auth)
        assert down.status_code == 503 and down.json()["code"] == "not_ready"


def test_cli_refuses_config_and_deploy_together(tmp_path, capsys):
    assert main(["serve", "--deploy", str(tmp_path / "d.yaml"), "--config", str(tmp_path / "c.yaml")]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["serve", "--deploy", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
