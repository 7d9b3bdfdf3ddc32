"""Every interval the project reports lies within its statistic's range (issue 47): each benchmark's
subsets and weighted aggregates in [0, 1], their paired differences in [-1, 1], and the probe's
accuracy blocks, at the edges: every example right, every one wrong, the fixture's own scores, on
1 to 8 rows. (RewardBench 2's weighted score drew [0.1765, 1.2875] on its 8-row fixture.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rewardplane.core.errors import UsageError
from rewardplane.data.synth import builtin_tokenizer
from rewardplane.eval import bootstrap
from rewardplane.eval.benchmarks import runner as benchmarks
from rewardplane.eval.compare import compare_examples
from rewardplane.eval.settings import EvalSettings
from rewardplane.objectives.base import PairScorer
from support.benchmark_scorer import fake_scorer

FIXTURES = Path(__file__).parent / "fixtures"
FILES = {"rewardbench": "rewardbench.jsonl", "rewardbench2": "rewardbench2.jsonl", "rm-bench": "rmbench.json"}
REPLICATES = 300
# RewardBench 2's Ties score adds 0.01 · a mean tanh in (-1, 1) to four terms in [0, 1]
RANGE = {"rewardbench": (0.0, 1.0), "rewardbench2": (-0.01, 1.01), "rm-bench": (0.0, 1.0)}


def constant_scorer(right: bool) -> PairScorer:
    """Every chosen response 1 and every rejected 0 (`right`), or the other way round."""

    def score(pairs, batch_size, progress=None):
        ones, zeros = np.ones(len(pairs)), np.zeros(len(pairs))
        return (ones, zeros, None) if right else (zeros, ones, None)

    return PairScorer("reward_model", builtin_tokenizer(), {"fake": True}, score)


def first_rows(benchmark: str, k: int, folder: Path) -> Path:
    source = FIXTURES / FILES[benchmark]
    if source.suffix == ".json":
        rows = json.loads(source.read_text())[:k]
        path = folder / "rows.json"
        path.write_text(json.dumps(rows))
    else:
        path = folder / "rows.jsonl"
        path.write_text("".join(source.read_text().splitlines(keepends=True)[:k]))
    return path


def intervals(node, path=""):
    """(where, low, high) of every bootstrap block in a summary or comparison."""
    if isinstance(node, dict):
        if "ci_95" in node:
            low, high = min(node["ci_95"][0], node["lower_95"]), node["ci_95"][1]
            if "bounds" in node:  # a bootstrap block (the headline repeats its aggregate's numbers)
                assert node["bounds"][0] <= low <= high <= node["bounds"][1], (path, node)
            yield path, low, high
        for key, value in node.items():
            yield from intervals(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from intervals(value, f"{path}[{i}]")


def evaluate(benchmark: str, data: Path, out: Path, scorer: PairScorer) -> dict | None:
    try:
        return benchmarks.evaluate_benchmark(
            benchmark=benchmark, data_path=data, model_path="fake", out_dir=out,
            options=EvalSettings(device="cpu", replicates=REPLICATES), scorer=scorer,
        )  # fmt: skip
    except UsageError:  # the first k rows left nothing valid (RewardBench 2's Ties rows need partners)
        return None


@pytest.mark.parametrize("benchmark", sorted(FILES))
def test_benchmark_intervals_stay_in_range_at_the_edges(benchmark, tmp_path):
    lowest, highest = RANGE[benchmark]
    checked = 0
    for k in range(1, 9):
        data = first_rows(benchmark, k, tmp_path)
        outs = {}
        for name, scorer in (("right", constant_scorer(True)), ("wrong", constant_scorer(False)),
                             ("fixture", fake_scorer())):  # fmt: skip
            summary = evaluate(benchmark, data, tmp_path / f"{k}-{name}", scorer)
            if summary is None:
                continue
            outs[name] = tmp_path / f"{k}-{name}" / "examples.jsonl"
            for where, low, high in intervals(summary):
                assert lowest <= low <= high <= highest, (benchmark, k, name, where, low, high)
                checked += 1
        for a, b in (("wrong", "right"), ("right", "wrong"), ("fixture", "right")):
            if a in outs and b in outs:
                comparison = compare_examples(outs[a], outs[b], replicates=REPLICATES)
                for where, low, high in intervals(comparison):
                    assert lowest - highest <= low <= high <= highest - lowest, (benchmark, k, a, b, where)
    assert checked > 8 * 3


def test_the_rewardbench2_fixture_score_interval_is_clipped_to_one(tmp_path):
    summary = benchmarks.evaluate_benchmark(
        benchmark="rewardbench2", data_path=FIXTURES / FILES["rewardbench2"], model_path="fake",
        out_dir=tmp_path, options=EvalSettings(device="cpu"), scorer=fake_scorer(),
    )  # fmt: skip
    block = summary["aggregates"]["score"]["bootstrap"]
    assert block["bounds"] == pytest.approx([-0.0025, 1.0025])  # Ties' 0.01 margin term, weighted 1/4
    assert block["ci_95"][1] <= block["bounds"][1]
    assert block["clipped"] is True  # the rescaled per-example values do reach past 1 here


@pytest.mark.parametrize("n", range(1, 9))
def test_accuracy_and_paired_difference_blocks_at_the_edges(n):
    for values in (np.ones(n), np.zeros(n), np.resize([1.0, 0.0, 0.5], n)):
        block = bootstrap.bootstrap_mean(values, statistic="accuracy", replicates=REPLICATES)
        assert block["lower_95"] >= 0.0 and 0.0 <= block["ci_95"][0] <= block["ci_95"][1] <= 1.0
        for other in (np.ones(n), np.zeros(n)):
            diff = bootstrap.paired_bootstrap(values, other, statistic="accuracy", replicates=REPLICATES)
            assert diff["lower_95"] >= -1.0 and -1.0 <= diff["ci_95"][0] <= diff["ci_95"][1] <= 1.0
