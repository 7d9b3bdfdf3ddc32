"""qualify end to end: real server processes (the fake server, and `rewardplane serve --deploy`)."""

import json
import subprocess
import sys

import pytest
import yaml

from rewardplane.bench.qualify import parse_plan, qualify
from support.bench_qualify import FAKE_SERVER, FAST_SWEEP, ROOT, SCORERS, plan_doc


def test_qualify_end_to_end_against_fake_deployments(tmp_path):
    """Six real server processes; mps50 breaks parity, consolidated emits NaN for b."""
    fake = {"offsets": {"mps": 0.0}, "faults": {"consolidated": {"b": "nan"}}}
    modes = ["dedicated", "shared", {"mode": "mps", "active_thread_percentages": [100]}, "consolidated"]
    plan = parse_plan(
        plan_doc(
            modes=modes,
            server={"command": FAKE_SERVER, "env": {"BENCH_FAKE": json.dumps(fake)}, "ready_timeout_s": 300},
        )
    )
    summary = qualify(plan, tmp_path)
    groups = {g["group"]: g for g in summary["groups"]}
    assert list(groups) == ["dedicated", "shared", "mps100", "consolidated"]
    ded, shared = groups["dedicated"], groups["shared"]
    assert ded["isolation"] and ded["gpus_held"] == 2 and ded["parity"] is None
    assert ded["rewards_per_gpu_hour"] == pytest.approx(ded["items_per_s_mean"] * 1800)
    # dedicated by isolation: each point is the slower scorer's items/s
    iso = [json.loads((tmp_path / "runs" / f"dedicated-{s}-fp16.json").read_text()) for s in "ab"]
    for run in iso:  # the coverage pass scored the whole corpus, so parity covers every item
        assert run["coverage"] == {"total": 5, "ok": 5, "failed": 0, "failures_by_reason": {}}
        assert len(run["scores"]) == FAST_SWEEP["corpus_size"]
    for k, point in enumerate(ded["points"]):
        assert point["items_per_s"] == min(run["points"][k]["items_per_s"] for run in iso)
    assert shared["ratio_vs_dedicated"]["rewards_per_gpu_hour"] == pytest.approx(
        shared["rewards_per_gpu_hour"] / ded["rewards_per_gpu_hour"]
    )
    assert all(p["pass"] and p["max_abs_delta"] == 0.0 for p in shared["parity"].values())
    cons = groups["consolidated"]
    assert cons["validity"]["failed"] == cons["validity"]["requests"] > 0
    assert set(cons["validity"]["failures_by_reason"]) == {"score_non_finite"}
    assert "mps100_vs_shared_items_per_s" in summary["goals"]["fp16"]
    assert not summary["passed"]
    assert any(f.startswith("consolidated/fp16:") and "score_non_finite" in f for f in summary["failures"])
    for name in ("summary.json", "report.md", "results.csv"):
        assert (tmp_path / name).is_file()
    assert len(summary["plots"]) == 3 and all((tmp_path / p).stat().st_size > 1000 for p in summary["plots"])
    report = (tmp_path / "report.md").read_text()
    assert "dedicated (isolation)" in report and "**Result: FAIL**" in report
    rows = (tmp_path / "results.csv").read_text().splitlines()
    assert rows[0].startswith("Mode,Scorers,Batch,Concurrency") and len(rows) == 1 + 5 * 2
    assert (
        yaml.safe_load((tmp_path / "deployments" / "mps100-fp16" / "deploy.yaml").read_text())["mode"]
        == "mps"
    )


def test_parity_failure_start_failure_and_budget_are_reported(tmp_path):
    fake = {"offsets": {"shared": 0.01}, "fail_modes": ["consolidated"]}
    server = {"command": FAKE_SERVER, "env": {"BENCH_FAKE": json.dumps(fake)}, "ready_timeout_s": 300}
    doc = plan_doc(scorers=SCORERS[:1], modes=["dedicated", "shared", "consolidated"], server=server)
    summary = qualify(parse_plan(doc), tmp_path / "a")
    failures = "\n".join(summary["failures"])
    assert "shared/fp16: parity failed for a: max |delta| 0.01" in failures
    assert "consolidated/fp16: deployment failed: consolidated/fp16: server exited with code 3" in failures
    assert (
        (tmp_path / "a" / "deployments" / "consolidated-fp16" / "server.log").read_text().startswith("fake")
    )

    budget = qualify(parse_plan({**doc, "budget_s": 0, "modes": ["dedicated", "shared"]}), tmp_path / "b")
    assert [g["status"] for g in budget["groups"]] == ["ok", "failed"]
    assert "budget_s=0 exhausted" in budget["groups"][1]["error"]


def test_cli_exit_codes(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(plan_doc(modes=["dedicated"])))
    cmd = [sys.executable, "-m", "rewardplane", "qualify", "--plan", str(plan), "--out", str(tmp_path / "o")]
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    dry = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True, env=env, timeout=120)
    assert dry.returncode == 0 and "dedicated:a/fp16" in dry.stdout
    plan.write_text("modes: [shared]\nscorers: [{name: a, kind: clip, shape: tiny-clip}]\n")
    bad = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "must include dedicated" in bad.stderr


@pytest.mark.slow
def test_qualify_against_real_serve_deploy_processes(tmp_path):
    """The real `rewardplane serve --deploy` (workers backend) with a rule scorer, two layouts."""
    scorers = [{"name": "length", "kind": "length", "max_batch_size": 8, "max_wait_ms": 1}]
    sweep = {**FAST_SWEEP, "concurrency": [2], "window_s": 0.3}
    doc = {"gpus": [], "scorers": scorers, "dtypes": ["fp32"], "modes": ["dedicated", "consolidated"],
           "sweep": sweep, "server": {"ready_timeout_s": 300}}  # fmt: skip
    summary = qualify(parse_plan(doc), tmp_path)
    assert summary["passed"], summary["failures"]
    ded, cons = summary["groups"]
    assert ded["isolation"] and cons["parity"]["length"]["max_abs_delta"] == 0.0
    run = json.loads((tmp_path / "runs" / "consolidated-fp32.json").read_text())
    assert run["mode"] == "consolidated" and run["environment"]["deployment"]["backend"] == "workers"


def test_cli_plan_overrides_go_through_the_config_loader(tmp_path, capsys):
    from rewardplane.cli import main

    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(plan_doc(modes=["dedicated"])))
    args = ["qualify", "--plan", str(plan), "--out", str(tmp_path / "o"), "--dry-run"]
    assert main([*args, "sweep.window_s=2", "goals.mps_vs_shared_items_per_s=1.3"]) == 0
    assert "measurement 16-24 s" in capsys.readouterr().out  # 2 deployments x 2 points x 2 s x 2..3 windows
    assert main([*args, "sweep.window_s=0"]) == 2
    assert "sweep.window_s must be > 0" in capsys.readouterr().err
