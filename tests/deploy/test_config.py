"""deploy.yaml validation: every refusal names the key and the reason."""

from __future__ import annotations

import pytest

from rewardplane.core.errors import ConfigError
from rewardplane.deploy.config import (
    DeviceProbe,
    load_deploy_config,
    normalize_mem_limit,
    parse_deploy_config,
)

GPU2 = DeviceProbe(cuda_available=True, gpu_count=2, control_binary="/usr/bin/nvidia-cuda-mps-control")
NO_CUDA = DeviceProbe(cuda_available=False, gpu_count=0, control_binary=None)
NO_BINARY = DeviceProbe(cuda_available=True, gpu_count=2, control_binary=None)


def doc(mode: str = "shared", **extra):
    base = {
        "mode": mode,
        "gpus": [0],
        "scorers": [
            {"name": "a", "kind": "length", "dtype": "fp32"},
            {"name": "b", "kind": "length", "dtype": "fp32"},
        ],
    }
    base.update(extra)
    return base


def test_dedicated_assigns_one_gpu_per_worker():
    cfg = parse_deploy_config(doc("dedicated", gpus=[0, 1]), GPU2)
    plans = cfg.worker_plans()
    assert [(p.name, p.gpu, p.env["CUDA_VISIBLE_DEVICES"]) for p in plans] == [("a", 0, "0"), ("b", 1, "1")]
    assert cfg.shared_fault_domain is False
    assert plans[0].scorers[0].spec == {"name": "a", "kind": "length", "dtype": "fp32"}


def test_dedicated_refuses_two_scorers_on_one_gpu():
    with pytest.raises(ConfigError, match="dedicated"):
        parse_deploy_config(doc("dedicated", gpus=[0]), GPU2)


def test_shared_mps_and_consolidated_layouts():
    shared = parse_deploy_config(doc("shared"), GPU2)
    assert [p.gpu for p in shared.worker_plans()] == [0, 0] and shared.shared_fault_domain
    cons = parse_deploy_config(doc("consolidated"), GPU2)
    (plan,) = cons.worker_plans()
    assert [s.name for s in plan.scorers] == ["a", "b"] and plan.gpu == 0
    d = doc("mps")
    d["scorers"][0].update(mps_active_thread_percentage=50, mps_pinned_mem_limit="8G")
    mps = parse_deploy_config(d, GPU2)
    env = mps.worker_plans()[0].env
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8G"
    assert "mps_active_thread_percentage" not in mps.scorers[0].spec
    assert mps.service_dict()["scorers"][0] == {"name": "a", "kind": "length", "dtype": "fp32"}


def test_cpu_only_layout_hides_gpus():
    cfg = parse_deploy_config(doc("shared", gpus=[]), NO_CUDA)
    assert cfg.worker_plans()[0].env == {"CUDA_VISIBLE_DEVICES": ""}


def test_config_gpu_index_maps_through_parent_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    cfg = parse_deploy_config(doc("dedicated", gpus=[0, 1]), GPU2)
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in cfg.worker_plans()] == ["4", "6"]


@pytest.mark.parametrize(
    ("mutate", "probe", "message"),
    [
        (lambda d: d.update(gpus=[0, 5]), GPU2, "unknown GPU id 5"),
        (lambda d: d["scorers"][0].update(gpu=1), GPU2, "unknown GPU id 1"),
        (lambda d: d.update(mode="mps", gpus=[0]), NO_CUDA, "unknown GPU id 0"),
        (lambda d: d.update(mode="mps", gpus=[]), NO_CUDA, "needs CUDA"),
        (lambda d: d.update(mode="mps"), NO_BINARY, "nvidia-cuda-mps-control"),
        (lambda d: d.update(mode="mps_external"), GPU2, "pipe directory"),
        (lambda d: d.update(mode="bogus"), GPU2, "not one of"),
        (lambda d: d.update(mps={"pipe_dir": "/tmp/x"}), GPU2, "only meaningful"),
        (lambda d: d["scorers"][0].update(mps_active_thread_percentage=50), GPU2, "need mode mps"),
        (
            lambda d: (d.update(mode="mps"), d["scorers"][0].update(mps_active_thread_percentage=0)),
            GPU2,
            "outside 1-100",
        ),
        (
            lambda d: (d.update(mode="mps"), d["scorers"][0].update(mps_active_thread_percentage=101)),
            GPU2,
            "outside 1-100",
        ),
        (
            lambda d: (d.update(mode="mps"), d["scorers"][0].update(mps_pinned_mem_limit="eight gigs")),
            GPU2,
            "malformed memory size",
        ),
        (
            lambda d: (
                d.update(mode="mps"),
                d["scorers"][0].update(mps_active_thread_percentage=40, dtype="fp16"),
            ),
            GPU2,
            "allow_reduced_precision_partition",
        ),
        (lambda d: d.update(mode="mps", mps={"pipe_dir": "relative/dir"}), GPU2, "absolute"),
        (lambda d: d.update(mode="mps", mps={"pipe_dir": "/tmp/" + "x" * 80}), GPU2, "Unix socket"),
        (lambda d: d["scorers"][0].update(memory_fraction=1.5), GPU2, "memory_fraction"),
        (lambda d: d["scorers"][1].update(name="a"), GPU2, "duplicate"),
        (lambda d: d.update(scorers=[]), GPU2, "non-empty"),
    ],
)
def test_refusals(mutate, probe, message):
    d = doc()
    mutate(d)
    with pytest.raises(ConfigError, match=message):
        parse_deploy_config(d, probe)


def test_reduced_precision_partition_allowed_when_opted_in():
    d = doc("mps", allow_reduced_precision_partition=True)
    d["scorers"][0].update(mps_active_thread_percentage=40, dtype="bf16")
    cfg = parse_deploy_config(d, GPU2)
    assert cfg.scorers[0].mps_active_thread_percentage == 40
    d["scorers"][0]["mps_active_thread_percentage"] = 100  # full device: no partition, no opt-in needed
    assert parse_deploy_config({**d, "allow_reduced_precision_partition": False}, GPU2)


@pytest.mark.parametrize(
    ("raw", "norm"), [("8G", "0=8G"), ("0=512mb", "0=512MB"), (" 0 = 1024M ", "0=1024M")]
)
def test_mem_limit_forms(raw, norm):
    assert normalize_mem_limit(raw, "x") == norm


@pytest.mark.parametrize("raw", ["1=8G", "0=8G,0=4G", "0=", "8X", "-1G", ""])
def test_mem_limit_refusals(raw):
    with pytest.raises(ConfigError):
        normalize_mem_limit(raw, "x")


def test_load_from_yaml(tmp_path):
    p = tmp_path / "deploy.yaml"
    p.write_text("mode: consolidated\nlimits: {max_items: 8}\nscorers:\n  - {name: a, kind: length}\n")
    cfg = load_deploy_config(p, NO_CUDA)
    assert cfg.mode == "consolidated" and cfg.service == {"limits": {"max_items": 8}}
    p.write_text("mode: [unclosed\n")
    with pytest.raises(ConfigError, match="YAML"):
        load_deploy_config(p, NO_CUDA)
