"""Every benchmark number equals the released scoring code's on the same per-example results.

tests/eval/fixtures/official/ holds, per benchmark, a fixed input in the published schema (every
subset, exact ties, RewardBench 2's shared top scores and Ties zero spreads, subsets left out
where the released code allows it) and `<benchmark>.official.json`: what the released code
itself — rewardbench 0.1.4 from PyPI, allenai/reward-bench at a0096928, THU-KEG/RM-Bench at
73c52d7 — computed on it, with the files' hashes and the command (`make_official.py` there).
The inputs run here through `rewardplane eval --benchmark`'s whole path with a scorer that reads
back the scores the fixture gives each response; no expected number is derived from our own
reading of the rules.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rewardplane.eval.benchmarks import runner
from rewardplane.eval.settings import EvalSettings
from support.benchmark_scorer import fake_scorer

OFFICIAL = Path(__file__).parent / "fixtures" / "official"
TOLERANCE = 1e-12


def released(benchmark: str) -> dict:
    return json.loads((OFFICIAL / f"{benchmark}.official.json").read_text())


def evaluate(tmp_path: Path, benchmark: str, data: Path) -> tuple[dict, list[dict]]:
    summary = runner.evaluate_benchmark(
        benchmark=benchmark, data_path=data, model_path="fake", out_dir=tmp_path,
        options=EvalSettings(device="cpu", replicates=50), scorer=fake_scorer(),
    )  # fmt: skip
    examples = [json.loads(line) for line in (tmp_path / "examples.jsonl").read_text().splitlines()]
    return summary, examples


def read_rows(path: Path) -> list[dict]:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines()]
    return json.loads(path.read_text())


def check_scores_were_read(rows: list[dict], examples: list[dict]) -> None:
    """The fake scorer gave every response the number the released code was handed."""
    assert len(examples) == len(rows)
    by_id = {str(r["id"]): r for r in rows}
    for ex in examples:
        assert ex["chosen_scores"] == by_id[ex["id"]]["score_chosen"]
        assert ex["rejected_scores"] == by_id[ex["id"]]["score_rejected"]


@pytest.mark.parametrize("case", ["all subsets", "absent subsets"])
def test_rewardbench_equals_rewardbench_0_1_4(tmp_path, case):
    record = released("rewardbench")
    official = record["official"][case]
    assert official["version"] == "0.1.4"
    absent = set(record["source"]["cases"].get(case, []))
    rows = [r for r in read_rows(OFFICIAL / record["data"]) if r["subset"] not in absent]
    data = tmp_path / "rb.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary, examples = evaluate(tmp_path / "out", "rewardbench", data)
    check_scores_were_read(rows, examples)
    subsets = {name: s["value"] for name, s in summary["subsets"].items()}
    assert subsets == pytest.approx(official["extra_results"], abs=TOLERANCE, rel=0)
    aggregates = {name: a["score"] for name, a in summary["aggregates"].items()}
    for section, value in official["sections"].items():
        assert aggregates[section] == pytest.approx(value, abs=TOLERANCE, rel=0), section
    assert aggregates["accuracy (all examples)"] == pytest.approx(official["accuracy"], abs=TOLERANCE, rel=0)
    # the leaderboard's Score: the mean of the four sections the released function returns
    sections = official["sections"].values()
    assert aggregates["score"] == pytest.approx(sum(sections) / len(sections), abs=TOLERANCE, rel=0)


def test_rewardbench_fixture_tells_the_xstest_weights_apart():
    """The fixture can catch swapped xstest counts: the two subsets' accuracies differ."""
    results = released("rewardbench")["official"]["all subsets"]["extra_results"]
    assert results["xstest-should-refuse"] != results["xstest-should-respond"]


def test_rewardbench2_equals_reward_bench_a0096928(tmp_path):
    record = released("rewardbench2")
    official = record["official"]
    rows = read_rows(OFFICIAL / record["data"])
    summary, examples = evaluate(tmp_path, "rewardbench2", OFFICIAL / record["data"])
    check_scores_were_read(rows, examples)
    subsets = {name: s["value"] for name, s in summary["subsets"].items()}
    assert subsets == pytest.approx(official["results_grouped"], abs=TOLERANCE, rel=0)
    credit = {ex["id"]: ex["value"] for ex in examples if ex["subset"] != "Ties"}
    assert credit == pytest.approx(official["per_row_results"], abs=TOLERANCE, rel=0)
    grouped = official["results_grouped"].values()
    assert summary["aggregates"]["score"]["score"] == pytest.approx(
        sum(grouped) / len(grouped), abs=TOLERANCE, rel=0
    )


def test_rmbench_equals_compute_accuracy_73c52d7(tmp_path):
    record = released("rm-bench")
    official = record["official"]["compute_accuracy"]
    rows = read_rows(OFFICIAL / record["data"])
    summary, examples = evaluate(tmp_path, "rm-bench", OFFICIAL / record["data"])
    check_scores_were_read(rows, examples)
    aggregates = {name: a["score"] for name, a in summary["aggregates"].items()}
    ours = {
        **{domain: aggregates[f"domain {domain}"] for domain in ("chat", "math", "code", "safety")},
        "easy_acc": aggregates["easy"],
        "normal_acc": aggregates["normal"],
        "hard_acc": aggregates["hard"],
        "total_avg_acc": aggregates["average"],
    }
    assert ours == pytest.approx(official, abs=TOLERANCE, rel=0)
    assert summary["headline"]["score"] == pytest.approx(official["total_avg_acc"], abs=TOLERANCE, rel=0)
    levels = summary["details"]["style_matrix"]["(mean over domains)"]
    assert [levels[k] for k in ("easy", "normal", "hard")] == pytest.approx(
        [official["easy_acc"], official["normal_acc"], official["hard_acc"]], abs=TOLERANCE, rel=0
    )
