import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rewardkit.bench.qualify import expand, load_plan, parity, parse_plan, qualify
from rewardkit.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
FAKE = [
    sys.executable,
    str(ROOT / "tests" / "support" / "bench_fake_server.py"),
    "--deploy",
    "{deploy}",
    "--port",
    "{port}",
]
SCORERS = [
    {"name": "a", "kind": "clip", "shape": "tiny-clip"},
    {"name": "b", "kind": "clip", "shape": "tiny-clip"},
]
FAST_SWEEP = {
    "batch": [2], "concurrency": [1, 2], "requests": 1, "warmup": 1, "window_s": 0.15,
    "stable_windows": 2, "max_windows": 3, "corpus_size": 10, "images": False,
}  # fmt: skip


def plan_doc(**kw):
    doc = {"gpus": [0], "scorers": SCORERS, "dtypes": ["fp16"], "sweep": FAST_SWEEP}
    return {**doc, **kw}


def probe(gpus):
    from rewardkit.deploy.config import DeviceProbe

    return DeviceProbe(cuda_available=gpus > 0, gpu_count=gpus, control_binary="/bin/true")


def test_one_gpu_dedicated_is_isolation_and_every_deploy_file_validates():
    from rewardkit.deploy.config import parse_deploy_config

    modes = ["dedicated", "consolidated", {"mode": "mps", "active_thread_percentages": [100, 50]}, "shared"]
    plan = parse_plan(plan_doc(modes=modes, allow_reduced_precision_partition=True))
    deployments = expand(plan)
    assert [d.label for d in deployments] == [
        "dedicated:a/fp16", "dedicated:b/fp16", "shared/fp16", "mps100/fp16", "mps50/fp16", "consolidated/fp16",
    ]  # fmt: skip
    assert [d.gpus_held for d in deployments] == [2, 2, 1, 1, 1, 1]
    assert deployments[0].scorers == ["a"] and deployments[2].scorers == ["a", "b"]
    assert deployments[4].doc["allow_reduced_precision_partition"] is True
    assert {s["mps_active_thread_percentage"] for s in deployments[4].doc["scorers"]} == {50}
    for dep in deployments:
        parsed = parse_deploy_config(dep.doc, probe(1))
        assert parsed.mode == dep.mode and {s.dtype for s in parsed.scorers} == {"fp16"}


def test_enough_gpus_gives_a_real_dedicated_deployment():
    from rewardkit.deploy.config import parse_deploy_config

    plan = parse_plan(plan_doc(gpus=[0, 1], modes=["dedicated", "shared"]))
    dedicated, shared = expand(plan)
    assert not plan.isolation and dedicated.label == "dedicated/fp16" and dedicated.gpus_held == 2
    assert [s.gpu for s in parse_deploy_config(dedicated.doc, probe(2)).scorers] == [0, 1]
    assert shared.gpus_held == 1 and shared.doc["gpus"] == [0]


def test_h200_plan_expands_to_the_documented_twelve_deployments():
    from rewardkit.deploy.config import parse_deploy_config

    plan = load_plan(ROOT / "benchmarks" / "qualify_h200.yaml")
    deployments = expand(plan)
    assert len(deployments) == 12 and plan.isolation and plan.dtypes == ["fp16", "bf16"]
    assert {d.group for d in deployments} == {"dedicated", "shared", "mps100", "mps50", "consolidated"}
    for dep in deployments:
        parse_deploy_config(dep.doc, probe(1))  # the 50% reduced-precision runs are allowed explicitly


@pytest.mark.parametrize(("dtype", "batches"), [("bf16", [32]), ("fp32", [16])])
def test_h200_bf16_and_fp32_plans_run_six_deployments_each(dtype, batches):
    from rewardkit.deploy.config import parse_deploy_config

    plan = load_plan(ROOT / "benchmarks" / f"qualify_h200_{dtype}.yaml")
    deployments = expand(plan)
    assert plan.dtypes == [dtype] and [d.group for d in deployments] == [
        "dedicated", "dedicated", "shared", "mps100", "mps50", "consolidated"
    ]  # fmt: skip
    # six deployments of ~45 s each (shapes initialise on the CPU) must fit in the budget
    assert plan.sweep["batch"] == batches and plan.budget_s >= 6 * 45
    for dep in deployments:
        parse_deploy_config(dep.doc, probe(1))


def test_a_deployment_is_terminated_when_qualify_is_killed(tmp_path):
    """SIGKILL of qualify (e.g. a device time limit) still SIGTERMs the server it started, so the
    gateway can stop its workers and quit its MPS daemon. The server here never becomes ready."""
    import os
    import signal
    import textwrap
    import time

    pid_file, term_file = tmp_path / "server.pid", tmp_path / "server.term"
    server = textwrap.dedent(
        f"""
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: (open({str(term_file)!r}, "w").write("term"), sys.exit(0)))
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        time.sleep(60)
        """
    )
    parent = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from rewardkit.bench.qualify import Deployment, running
        dep = Deployment("x/fp32", "x", "shared", "fp32", {{}}, ["a"], 1)
        with running(dep, Path({str(tmp_path / "work")!r}), {{"command": [sys.executable, "-c", {server!r}]}}):
            pass
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", parent], env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    )
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline and proc.poll() is None, "server did not start"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    while not term_file.exists():
        assert time.monotonic() < deadline, "the server outlived qualify without a SIGTERM"
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (plan_doc(modes=["shared"]), "must include dedicated"),
        (plan_doc(modes=["dedicated", "turbo"]), "not one of"),
        (
            plan_doc(modes=["dedicated", {"mode": "shared", "active_thread_percentages": [50]}]),
            "only applies",
        ),
        (plan_doc(modes=["dedicated", {"mode": "mps", "active_thread_percentages": [0]}]), "1-100"),
        (plan_doc(dtypes=["fp8"]), "dtypes"),
        (plan_doc(scorers=[{**SCORERS[0], "dtype": "fp16"}]), "via `dtypes:`"),
        (plan_doc(scorers=[SCORERS[0], SCORERS[0]]), "unique name"),
        (plan_doc(sweep={"batchsize": [1]}), "unknown keys"),
        (plan_doc(typo=1), "unknown keys"),
    ],
)
def test_bad_plans_are_config_errors(doc, message):
    with pytest.raises(ConfigError, match=message):
        parse_plan(doc)


def test_parity_per_scorer_max_p99_and_coverage():
    ref = {f"i{k}": {"a": float(k), "b": 0.0} for k in range(100)}
    cand = {f"i{k}": {"a": float(k) + (0.002 if k == 7 else 0.0), "b": 0.0} for k in range(99)}
    out = parity(ref, cand, ["a", "b"], 1e-3, {"a": 0.0005})
    assert out["a"]["max_abs_delta"] == pytest.approx(0.002) and not out["a"]["pass"]
    assert out["a"]["p99_abs_delta"] < 0.002 and out["a"]["reference_self_spread"] == 0.0005
    assert out["b"] == {**out["b"], "compared": 99, "missing": 1, "max_abs_delta": 0.0, "pass": False}
    full = parity(ref, ref, ["a", "b"], 1e-3, {})
    assert all(v["pass"] and v["missing"] == 0 for v in full.values())


def test_qualify_end_to_end_against_fake_deployments(tmp_path):
    """Six real server processes; mps50 breaks parity, consolidated emits NaN for b."""
    fake = {"offsets": {"mps": 0.0}, "faults": {"consolidated": {"b": "nan"}}}
    modes = ["dedicated", "shared", {"mode": "mps", "active_thread_percentages": [100]}, "consolidated"]
    plan = parse_plan(
        plan_doc(
            modes=modes,
            server={"command": FAKE, "env": {"BENCH_FAKE": json.dumps(fake)}, "ready_timeout_s": 60},
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
    server = {"command": FAKE, "env": {"BENCH_FAKE": json.dumps(fake)}, "ready_timeout_s": 60}
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
    cmd = [sys.executable, "-m", "rewardkit", "qualify", "--plan", str(plan), "--out", str(tmp_path / "o")]
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    dry = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True, env=env, timeout=120)
    assert dry.returncode == 0 and "dedicated:a/fp16" in dry.stdout
    plan.write_text("modes: [shared]\nscorers: [{name: a, kind: clip}]\n")
    bad = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "must include dedicated" in bad.stderr


@pytest.mark.slow
def test_qualify_against_real_serve_deploy_processes(tmp_path):
    """The real `rewardkit serve --deploy` (workers backend) with a rule scorer, two layouts."""
    scorers = [{"name": "length", "kind": "length", "max_batch_size": 8, "max_wait_ms": 1}]
    sweep = {**FAST_SWEEP, "concurrency": [2], "window_s": 0.3}
    doc = {"gpus": [], "scorers": scorers, "dtypes": ["fp32"], "modes": ["dedicated", "consolidated"],
           "sweep": sweep, "server": {"ready_timeout_s": 180}}  # fmt: skip
    summary = qualify(parse_plan(doc), tmp_path)
    assert summary["passed"], summary["failures"]
    ded, cons = summary["groups"]
    assert ded["isolation"] and cons["parity"]["length"]["max_abs_delta"] == 0.0
    run = json.loads((tmp_path / "runs" / "consolidated-fp32.json").read_text())
    assert run["mode"] == "consolidated" and run["environment"]["deployment"]["backend"] == "workers"


def test_goals_compare_on_points_gpu_bound_in_both():
    from rewardkit.bench.qualify import _goals

    def group(name, mode, gpus, points):
        pts = [
            {"batch": b, "concurrency": c, "rate": None, "items_per_s": v, "regime": r}
            for b, c, v, r in points
        ]
        return {"group": name, "mode": mode, "dtype": "fp16", "status": "ok", "gpus_held": gpus, "points": pts,
                "validity": {"failed": 0}, "parity": None}  # fmt: skip

    groups = [
        group("dedicated", "dedicated", 2, [(8, 4, 50.0, "host_bound"), (32, 16, 100.0, "gpu_bound")]),
        group("shared", "shared", 1, [(8, 4, 40.0, "host_bound"), (32, 16, 100.0, "gpu_bound")]),
        group("mps50", "mps", 1, [(8, 4, 80.0, "host_bound"), (32, 16, 110.0, "gpu_bound")]),
        group("consolidated", "consolidated", 1, [(8, 4, 10.0, "host_bound"), (32, 16, 99.0, "host_bound")]),
    ]
    goals = _goals(groups, "fp16")
    mps = goals["mps50_vs_shared_items_per_s"]
    assert mps["basis"] == "gpu_bound points" and mps["points"] == 1
    assert mps["value"] == pytest.approx(1.1) and not mps["met"]  # the host-bound 2x does not count
    cons = goals["consolidated_vs_dedicated_per_gpu_hour"]
    assert cons["basis"].startswith("all points") and cons["value"] == pytest.approx(109 / 150 * 2)
    assert goals["all_valid"] and goals["parity"]


def test_consolidated_goal_states_its_equal_utilisation_ceiling():
    """The H200 bf16 long-window numbers: clip_l 1792 items/s at 82.7 %, clip_h 1081 at 85.5 %."""
    from rewardkit.bench.qualify import _goals, equal_utilisation_ceiling, gpu_ms_per_item

    def run(points):
        return {"points": [{"items_per_s": v, "resources": {"gpu_util_mean": u}} for v, u in points]}

    clip_l = gpu_ms_per_item(run([(1792.0, 82.7)]))
    clip_h = gpu_ms_per_item(run([(1081.0, 85.5), (1081.0, 85.5)]))
    assert clip_l == pytest.approx(0.4615, abs=1e-4) and clip_h == pytest.approx(0.7909, abs=1e-4)
    assert equal_utilisation_ceiling({"clip_l": clip_l, "clip_h": clip_h}) == pytest.approx(
        2 * clip_h / (clip_l + clip_h)
    )
    # equal towers gain nothing per GPU-hour; only a negligible second scorer approaches 2x
    assert equal_utilisation_ceiling({"a": 1.0, "b": 1.0}) == pytest.approx(1.0)
    assert equal_utilisation_ceiling({"a": 1.0, "b": 1e-6}) == pytest.approx(2.0, abs=1e-5)
    assert equal_utilisation_ceiling({"a": 1.0, "b": None}) is None  # no GPU samples: no claim
    assert gpu_ms_per_item(run([(10.0, None)])) is None

    point = {"batch": 32, "concurrency": 16, "rate": None, "regime": "gpu_bound"}
    base = {"dtype": "bf16", "status": "ok", "validity": {"failed": 0}, "parity": None}
    groups = [
        {**base, "group": "dedicated", "mode": "dedicated", "gpus_held": 2, "points": [{**point, "items_per_s": 1081.0}],
         "gpu_ms_per_item": {"clip_l": clip_l, "clip_h": clip_h}},
        {**base, "group": "consolidated", "mode": "consolidated", "gpus_held": 1,
         "points": [{**point, "items_per_s": 700.0}]},
    ]  # fmt: skip
    goal = _goals(groups, "bf16")["consolidated_vs_dedicated_per_gpu_hour"]
    assert goal["value"] == pytest.approx(2 * 700 / 1081)
    assert goal["equal_utilisation_ceiling"] == pytest.approx(1.263, abs=1e-3)
    assert goal["gpu_ms_per_item"] == {"clip_l": clip_l, "clip_h": clip_h}
