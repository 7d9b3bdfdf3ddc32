"""Parity, goals and the equal-utilisation ceiling, on hand-built runs and groups."""

import pytest

from rewardplane.bench.qualify import (
    Goals,
    equal_utilisation_ceiling,
    evaluate_goals,
    gpu_ms_per_item,
    parity,
)


def test_parity_per_scorer_max_p99_and_coverage():
    ref = {f"i{k}": {"a": float(k), "b": 0.0} for k in range(100)}
    cand = {f"i{k}": {"a": float(k) + (0.002 if k == 7 else 0.0), "b": 0.0} for k in range(99)}
    out = parity(ref, cand, ["a", "b"], 1e-3, {"a": 0.0005})
    assert out["a"]["max_abs_delta"] == pytest.approx(0.002) and not out["a"]["pass"]
    assert out["a"]["p99_abs_delta"] < 0.002 and out["a"]["reference_self_spread"] == 0.0005
    assert out["b"] == {**out["b"], "compared": 99, "missing": 1, "max_abs_delta": 0.0, "pass": False}
    full = parity(ref, ref, ["a", "b"], 1e-3, {})
    assert all(v["pass"] and v["missing"] == 0 for v in full.values())


def group(name, mode, gpus, points):
    pts = [
        {"batch": b, "concurrency": c, "rate": None, "items_per_s": v, "regime": r} for b, c, v, r in points
    ]
    return {"group": name, "mode": mode, "dtype": "fp16", "status": "ok", "gpus_held": gpus, "points": pts,
            "validity": {"failed": 0}, "parity": None}  # fmt: skip


GROUPS = [
    group("dedicated", "dedicated", 2, [(8, 4, 50.0, "host_bound"), (32, 16, 100.0, "gpu_bound")]),
    group("shared", "shared", 1, [(8, 4, 40.0, "host_bound"), (32, 16, 100.0, "gpu_bound")]),
    group("mps50", "mps", 1, [(8, 4, 80.0, "host_bound"), (32, 16, 110.0, "gpu_bound")]),
    group("consolidated", "consolidated", 1, [(8, 4, 10.0, "host_bound"), (32, 16, 99.0, "host_bound")]),
]


def test_goals_compare_on_points_gpu_bound_in_both():
    goals = evaluate_goals(GROUPS, "fp16", Goals())
    mps = goals["mps50_vs_shared_items_per_s"]
    assert mps["basis"] == "gpu_bound points" and mps["points"] == 1
    assert mps["value"] == pytest.approx(1.1) and not mps["met"]  # the host-bound 2x does not count
    cons = goals["consolidated_vs_dedicated_per_gpu_hour"]
    assert cons["basis"].startswith("all points") and cons["value"] == pytest.approx(109 / 150 * 2)
    assert goals["all_valid"] and goals["parity"]


def test_goal_targets_come_from_the_plan():
    goals = evaluate_goals(
        GROUPS, "fp16", Goals(mps_vs_shared_items_per_s=1.05, consolidated_vs_dedicated_per_gpu_hour=1.4)
    )
    assert (
        goals["mps50_vs_shared_items_per_s"]["target"] == 1.05 and goals["mps50_vs_shared_items_per_s"]["met"]
    )
    assert goals["consolidated_vs_dedicated_per_gpu_hour"]["target"] == 1.4
    assert goals["consolidated_vs_dedicated_per_gpu_hour"]["met"]  # 1.45 >= 1.4


def test_consolidated_goal_states_its_equal_utilisation_ceiling():
    """The H200 bf16 long-window numbers: clip_l 1792 items/s at 82.7 %, clip_h 1081 at 85.5 %."""

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
    goal = evaluate_goals(groups, "bf16", Goals())["consolidated_vs_dedicated_per_gpu_hour"]
    assert goal["value"] == pytest.approx(2 * 700 / 1081)
    assert goal["equal_utilisation_ceiling"] == pytest.approx(1.263, abs=1e-3)
    assert goal["gpu_ms_per_item"] == {"clip_l": clip_l, "clip_h": clip_h}
