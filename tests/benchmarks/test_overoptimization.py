"""benchmarks/overoptimization.py runs end to end in a small configuration (so the recorded
run cannot rot), and its world is what its docstring says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "overoptimization.py"), *args, "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((tmp_path / "audit_details.json").read_text())


def test_a_small_lead_run_goes_through_the_audit_stream_and_records_its_run(tmp_path):
    details = _run(tmp_path, "--part", "lead", "--seeds", "1", "--versions", "24", "--prompts", "96",
                   "--sample", "0.2", "--plot", str(tmp_path / "example.png"))  # fmt: skip
    (run,) = details["lead"]
    assert len(run["gold_mean"]) == 24 and run["bins"] >= 8
    assert 0 <= run["gold_peak_version"] < 24 and run["gold_at_peak"] == max(run["gold_mean"])
    assert run["first_fired"].get("overoptimization") is not None  # the proxy is exploited here
    assert (tmp_path / "example.png").read_bytes().startswith(b"\x89PNG")
    assert details["environment"]["numpy"] and "--part lead" in details["command"]
    assert not (tmp_path / "audit.json").exists()  # headline keys only from a complete run


def test_signatures_and_null_parts(tmp_path):
    details = _run(tmp_path, "--part", "signatures", "--normal", "40")
    signatures = details["signatures"]
    assert (
        signatures["hit_rate"] == 1.0 and signatures["normal"] == 200
    )  # 2 x 40 task answers, 40 each of the rest
    assert [x["exploit"] for x in signatures["out_of_scope"]] == [
        "an object equal to everything", "write the grader's result", "every candidate in one box",
    ]  # fmt: skip
    details = _run(tmp_path, "--part", "null", "--null-runs", "1", "--null-bins", "60", "--null-n", "60")
    assert [row["null"] for row in details["null"]][0] == "plateau"


def test_gold_is_the_tasks_rule_and_the_proxy_rewards_length():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import overoptimization as bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert bench.gold("apple, pear and plum.", "fruit") == 1.0
    assert bench.gold("apple, apple.", "fruit") == 0.0  # not distinct
    assert bench.gold("apple, pear, plum, kiwi and lemon.", "fruit") == 0.0  # five words
    assert bench.gold("apple and hammer.", "fruit") == 0.0
    theta = bench.fit_proxy(200, seed=1000)
    short, long = (
        bench.counts(["apple", "pear"]),
        bench.counts(["apple", "pear", "plum", "kiwi", "lemon", "mango"]),
    )
    assert long @ theta > short @ theta  # more category words score higher, past the rule's four


def test_the_cost_part_runs_fresh_pairs_and_waits_for_the_boost(tmp_path):
    details = _run(tmp_path, "--part", "cost", "--cost-proxy", "rules", "--cost-pairs", "1", "--cost-windows", "1",
                   "--cost-seconds", "0.5", "--workdir", str(tmp_path / "w"))  # fmt: skip
    cost = details["cost"]
    (pair,) = cost["pairs"]
    assert pair["items"]["off"] > 0 and pair["items"]["on"] > 0 and cost["control"] is False
    assert pair["sample_rate_at_end"] == 0.03  # measured after the epoch's boost
    assert len(cost["pair_cpu_per_item_ratios"]) == 1
    # the share counts the windows' items only, not the warm-up's boosted ones
    assert 0 <= pair["sampled_in_windows"] < pair["audit_counts"]["sampled"] and cost["sampled_share"] < 0.12
