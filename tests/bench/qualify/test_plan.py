"""The plan model and its expansion into deployments (no server is started here)."""

import pytest

from rewardplane.bench.qualify import Goals, expand, load_plan, parse_plan
from rewardplane.core.errors import ConfigError
from support.bench_qualify import ROOT, SCORERS, plan_doc, probe

H200_PLANS = sorted((ROOT / "benchmarks").glob("qualify_h200*.yaml"))


def test_one_gpu_dedicated_is_isolation_and_every_deploy_file_validates():
    from rewardplane.deploy.config import parse_deploy_config

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
    from rewardplane.deploy.config import parse_deploy_config

    plan = parse_plan(plan_doc(gpus=[0, 1], modes=["dedicated", "shared"]))
    dedicated, shared = expand(plan)
    assert not plan.isolation and dedicated.label == "dedicated/fp16" and dedicated.gpus_held == 2
    assert [s.gpu for s in parse_deploy_config(dedicated.doc, probe(2)).scorers] == [0, 1]
    assert shared.gpus_held == 1 and shared.doc["gpus"] == [0]


def test_h200_plan_expands_to_the_documented_twelve_deployments():
    from rewardplane.deploy.config import parse_deploy_config

    plan = load_plan(ROOT / "benchmarks" / "qualify_h200.yaml")
    deployments = expand(plan)
    assert len(deployments) == 12 and plan.isolation and plan.dtypes == ["fp16", "bf16"]
    assert {d.group for d in deployments} == {"dedicated", "shared", "mps100", "mps50", "consolidated"}
    for dep in deployments:
        parse_deploy_config(dep.doc, probe(1))  # the 50% reduced-precision runs are allowed explicitly


@pytest.mark.parametrize(("dtype", "batches"), [("bf16", [32]), ("fp32", [16])])
def test_h200_bf16_and_fp32_plans_run_six_deployments_each(dtype, batches):
    from rewardplane.deploy.config import parse_deploy_config

    plan = load_plan(ROOT / "benchmarks" / f"qualify_h200_{dtype}.yaml")
    deployments = expand(plan)
    assert plan.dtypes == [dtype] and [d.group for d in deployments] == [
        "dedicated", "dedicated", "shared", "mps100", "mps50", "consolidated"
    ]  # fmt: skip
    # six deployments of ~45 s each (shapes initialise on the CPU) must fit in the budget
    assert plan.sweep.batch == batches and plan.budget_s >= 6 * 45
    for dep in deployments:
        parse_deploy_config(dep.doc, probe(1))


@pytest.mark.parametrize("path", H200_PLANS, ids=lambda p: p.name)
def test_every_h200_plan_states_the_issue_goals_explicitly(path):
    """The goals are plan data: each H200 plan writes them out instead of relying on defaults."""
    import yaml

    assert set(yaml.safe_load(path.read_text())["goals"]) == {
        "mps_vs_shared_items_per_s", "consolidated_vs_dedicated_per_gpu_hour"
    }  # fmt: skip
    assert load_plan(path).goals == Goals(
        mps_vs_shared_items_per_s=1.15, consolidated_vs_dedicated_per_gpu_hour=2.0
    )


def test_goals_default_to_the_issue_targets_and_a_plan_can_change_them():
    assert parse_plan(plan_doc()).goals == Goals()
    assert (Goals().mps_vs_shared_items_per_s, Goals().consolidated_vs_dedicated_per_gpu_hour) == (1.15, 2.0)
    plan = parse_plan(plan_doc(goals={"mps_vs_shared_items_per_s": 1.3}))
    assert (
        plan.goals.mps_vs_shared_items_per_s == 1.3
        and plan.goals.consolidated_vs_dedicated_per_gpu_hour == 2.0
    )


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
        (
            plan_doc(sweep={"stable_windows": 4, "max_windows": 3}),
            "sweep.stable_windows must be <= max_windows",
        ),
        (
            plan_doc(scorers=[{**SCORERS[0], "options": {"divisr": 100}}]),
            r"unknown config key scorers\[0\]\.options\.divisr \(did you mean scorers\[0\]\.options\.divisor\?\)",
        ),
        (plan_doc(typo=1), "unknown keys"),
        (plan_doc(goals={"mps_vs_shared": 1.2}), "unknown keys"),
    ],
)
def test_bad_plans_are_config_errors(doc, message):
    with pytest.raises(ConfigError, match=message):
        parse_plan(doc)


def test_bench_qualify_and_the_benchmarks_share_one_sweep_definition():
    """`rewardplane bench`'s flags, a plan's `sweep:` and benchmarks/serve.py take their load
    settings and defaults from one model (bench/sweep.py `Sweep`)."""
    import argparse
    import importlib.util

    from rewardplane.bench.qualify import Sweep
    from rewardplane.bench.sweep import Sweep as BenchSweep
    from rewardplane.cli.bench import SWEEP_FLAGS, register, sweep_from_args

    no_sweep = {k: v for k, v in plan_doc().items() if k != "sweep"}
    assert Sweep is BenchSweep and parse_plan(no_sweep).sweep == Sweep()
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["bench", "--url", "u", "--scorers", "a", "--out", "o.json"])
    assert sweep_from_args(args) == Sweep()  # no flag: the model's defaults, batch 1, 8, 32
    assert Sweep().batch == [1, 8, 32] and set(SWEEP_FLAGS) <= set(Sweep.model_fields)
    args = parser.parse_args(["bench", "--url", "u", "--scorers", "a", "--out", "o", "--requests", "7"])
    assert sweep_from_args(args) == Sweep(requests=7)
    spec = importlib.util.spec_from_file_location("serve_bench", ROOT / "benchmarks" / "serve.py")
    serve_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(serve_bench)
    defaults = serve_bench.parse_args([])
    assert defaults.batches == Sweep().batch and defaults.concurrency == Sweep().concurrency


def test_bench_flags_are_checked_by_the_sweep_model():
    import argparse

    from rewardplane.cli.bench import register, sweep_from_args
    from rewardplane.core.errors import UsageError

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    base = ["bench", "--url", "u", "--scorers", "a", "--out", "o"]
    with pytest.raises(UsageError, match="^--requests must be >= 1, got 0$"):
        sweep_from_args(parser.parse_args([*base, "--requests", "0"]))
    with pytest.raises(UsageError, match="^--stable-windows must be <= max_windows"):
        sweep_from_args(parser.parse_args([*base, "--stable-windows", "5", "--max-windows", "4"]))
