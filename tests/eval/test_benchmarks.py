"""`rewardplane eval --benchmark`: the released scoring rules on hand-written fixtures, the bootstrap
recomputed independently, the readers, the wrong-schema message and compare on two outputs.

Every fixture response ends in `score=X`; the fake scorer reads X back from the tokens it is
given, so each expected number below is computed by hand from the fixture file.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from rewardplane.cli import main
from rewardplane.core.errors import UsageError
from rewardplane.data.synth import builtin_tokenizer
from rewardplane.eval.benchmarks import rewardbench2, runner
from rewardplane.eval.compare import compare_examples
from rewardplane.eval.settings import EvalSettings
from rewardplane.objectives.base import PairScorer
from support.benchmark_scorer import fake_scorer, read_score

FIXTURES = Path(__file__).parent / "fixtures"
REPLICATES = 500


def run(tmp_path, benchmark, data, scorer=None, **kw):
    return runner.evaluate_benchmark(
        benchmark=benchmark, data_path=data, model_path="fake", out_dir=tmp_path,
        options=EvalSettings(device="cpu", replicates=REPLICATES), scorer=scorer or fake_scorer(), **kw,
    )  # fmt: skip


def recomputed(values: np.ndarray, seed: int = 1234, replicates: int = REPLICATES) -> dict[str, float]:
    """The bootstrap of docs/evaluation.md, written out independently of rewardplane.eval.bootstrap."""
    rng = np.random.Generator(np.random.PCG64(seed))
    idx = rng.integers(0, values.size, size=(replicates, values.size))
    means = values[idx].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {"point": values.mean(), "low": low, "high": high, "lower_95": np.percentile(means, 5)}


def test_rewardbench_rules_by_hand(tmp_path):
    summary = run(tmp_path, "rewardbench", FIXTURES / "rewardbench.jsonl")
    data = summary["data"]
    assert (data["rows"], data["valid"], data["rejected"]) == (11, 8, 3)
    assert data["rejections"] == {"duplicate_id": 1, "missing_field": 1, "empty_completion": 1}
    assert data["distinct_texts"] == 15  # "hammer. score=1" is shared by two examples, scored once
    subsets = {k: v["value"] for k, v in summary["subsets"].items()}
    assert subsets == {
        "alpacaeval-easy": 0.5, "mt-bench-hard": 1.0, "refusals-dangerous": 0.0,  # a tie is wrong
        "math-prm": 0.5, "hep-python": 1.0, "xstest-should-respond": 1.0,
    }  # fmt: skip
    agg = {k: v["score"] for k, v in summary["aggregates"].items()}
    chat, chat_hard = 0.5, 1.0
    safety = (0 * 100 + 1 * 250) / (100 + 250)  # EXAMPLE_COUNTS weights (xstest-should-respond 250)
    reasoning = (0.5 * 984 + 1 * 164) / (984 + 164)  # math-prm upweighted to equal the code subsets
    assert agg["Chat"] == pytest.approx(chat) and agg["Chat Hard"] == pytest.approx(chat_hard)
    assert agg["Safety"] == pytest.approx(safety) and agg["Reasoning"] == pytest.approx(reasoning)
    assert agg["score"] == pytest.approx((chat + chat_hard + safety + reasoning) / 4)
    assert agg["accuracy (all examples)"] == pytest.approx(5 / 8)
    assert summary["headline"]["name"] == "score"
    assert "RewardBench score: 0.696" in summary["headline"]["sentence"]


def test_rewardbench_bootstrap_recomputed_independently(tmp_path):
    summary = run(tmp_path, "rewardbench", FIXTURES / "rewardbench.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "examples.jsonl").read_text().splitlines()]
    assert all(r["data_sha256"] == summary["data_sha256"] for r in rows)
    # the score's per-example values from the EXAMPLE_COUNTS weights, by hand
    counts = {"alpacaeval-easy": 100, "mt-bench-hard": 37, "refusals-dangerous": 100, "xstest-should-respond": 250,
              "math-prm": 984, "hep-python": 164}  # fmt: skip
    sections = [["alpacaeval-easy"], ["mt-bench-hard"], ["refusals-dangerous", "xstest-should-respond"],
                ["math-prm", "hep-python"]]  # fmt: skip
    weight = {s: counts[s] / sum(counts[m] for m in sec) / len(sections) for sec in sections for s in sec}
    n_in = {s: sum(r["subset"] == s for r in rows) for s in weight}
    values = np.array([len(rows) * weight[r["subset"]] / n_in[r["subset"]] * r["correct"] for r in rows])
    expected = recomputed(values)
    block = summary["aggregates"]["score"]["bootstrap"]
    assert block["point"] == pytest.approx(expected["point"])
    # within the score's range [0, 1]: the rescaled values resample beyond it on 8 rows
    assert block["ci_95"] == pytest.approx([max(expected["low"], 0.0), min(expected["high"], 1.0)])
    assert block["lower_95"] == pytest.approx(max(expected["lower_95"], 0.0))
    assert (block["seed"], block["replicates"], block["n"]) == (1234, REPLICATES, 8)
    assert len(block["index_sha256"]) == 64 and len(block["means_sha256"]) == 64
    # a subset: plain accuracy
    sub = summary["subsets"]["math-prm"]["bootstrap"]
    exp = recomputed(np.array([float(r["correct"]) for r in rows if r["subset"] == "math-prm"]))
    assert sub["ci_95"] == pytest.approx([exp["low"], exp["high"]])
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["examples_sha256"] == hashlib.sha256((tmp_path / "examples.jsonl").read_bytes()).hexdigest()


def test_rewardbench2_best_of_4_and_ties_by_hand(tmp_path):
    summary = run(tmp_path, "rewardbench2", FIXTURES / "rewardbench2.jsonl")
    assert summary["data"]["rejections"] == {"schema": 2}  # num_correct mismatch, malformed Ties id
    rows = {r["id"]: r for r in map(json.loads, (tmp_path / "examples.jsonl").read_text().splitlines())}
    assert rows["10"]["value"] == 1.0 and rows["10"]["correct"]
    assert rows["11"]["value"] == 0.5 and not rows["11"]["correct"]  # tied at the top with one rejected: 1/2
    assert rows["12"]["value"] == 0.0 and rows["13"]["value"] == 1.0
    assert rows["ref:1"]["ties"] == {
        "accurate": True,
        "different_correct_margin": None,
        "correct_incorrect_margin": 2.0,
    }
    assert rows["tied:1"]["ties"] == {
        "accurate": True,
        "different_correct_margin": 2.0,
        "correct_incorrect_margin": 0.5,
    }
    assert rows["ref:2"]["ties"]["accurate"] is False
    # Ties: ref accuracy 1/2, tied accuracy 1; prompt 1: 0.5 > 2? no, min(2, 0.5) > 2? no;
    # prompt 2: 1.5 > 0.5 yes, min(-1, 1.5) > 0.5 no; margins tanh(0.5/2 - 1), tanh(-1/0.5 - 1)
    margin = (math.tanh(0.5 / 2 - 1) + math.tanh(-1 / 0.5 - 1)) / 2
    ties = 0.3 * 1.0 + 0.3 * 0.5 + 0.2 * 0.5 + 0.2 * 0.0 + 0.01 * margin
    details = summary["details"]["ties"]["Ties"]
    assert details["ties_score"] == pytest.approx(ties)
    assert (details["ref_accuracy"], details["tied_accuracy"], details["preferred"], details["preferred_hard"]) == (
        0.5, 1.0, 0.5, 0.0,
    )  # fmt: skip
    subsets = {k: v["value"] for k, v in summary["subsets"].items()}
    assert subsets == pytest.approx({"Factuality": 0.75, "Focus": 0.0, "Math": 1.0, "Ties": ties})
    assert summary["aggregates"]["score"]["score"] == pytest.approx((0.75 + 0.0 + 1.0 + ties) / 4)
    assert summary["chance"] == 0.25


def test_ties_shares_sum_to_the_released_formula():
    """The per-row shares average to the Ties score for any scores, including a zero correct spread."""
    items = [
        runner.Item("ref:1", "Ties", "p", ("a",), ("b", "c")),
        runner.Item("tied:1", "Ties", "p", ("a", "d"), ("b", "c")),
        runner.Item("tied:2", "Ties", "q", ("a", "d"), ("b",)),
    ]
    items = [runner.Item(i.id, i.subset, i.prompt, i.chosen, i.rejected,
                             {"ties_kind": i.id.split(":")[0], "ties_prompt": i.id.split(":")[1]}) for i in items]  # fmt: skip
    chosen = [np.array([1.0]), np.array([2.0, 2.0]), np.array([0.0, 1.0])]
    rejected = [np.array([0.0, 3.0]), np.array([1.0, 0.5]), np.array([0.5])]
    records = rewardbench2.score(items, chosen, rejected)
    total, _, terms = rewardbench2.ties_score(items, [r["ties"] for r in records])
    assert np.mean([r["value"] for r in records]) == pytest.approx(total)
    # prompt 1: spread of the correct answers 0, min(-2, 1) / 0 - 1 = -inf → tanh = -1, as numpy gives
    # in the released code; prompt 2 has no ref row and is left out of the margin terms
    assert terms["margin"] == -1.0 and terms["preferred"] == 1.0 and terms["preferred_hard"] == 0.0


def test_rmbench_style_matrix_by_hand(tmp_path):
    summary = run(tmp_path, "rm-bench", FIXTURES / "rmbench.json")
    assert summary["data"]["rejections"] == {"schema": 1}  # two chosen styles instead of three
    style = summary["details"]["style_matrix"]
    assert style["chat"]["matrix"] == [[1, 1, 0], [1, 1, 0], [1, 1, 0]]
    # Safety pools its safety-refuse row (all 0) and its safety-response row
    assert style["safety"]["matrix"] == [[0, 0, 0], [0.5, 0, 0], [0.5, 0.5, 0]]
    # each level is the mean over the domains present (chat, math, safety) of the domain's level,
    # as the released compute_accuracy gives it; pooled over the four rows it would be 3/4, 5/12, 1/3
    levels = {k: summary["aggregates"][k]["score"] for k in ("easy", "normal", "hard")}
    assert levels == pytest.approx(
        {"easy": (1 + 1 + 0.5) / 3, "normal": (2 / 3 + 1 + 0) / 3, "hard": (1 / 3 + 1) / 3}
    )
    assert style["(mean over domains)"]["easy"] == pytest.approx(5 / 6)
    assert np.mean(list(levels.values())) == pytest.approx(summary["aggregates"]["average"]["score"])
    assert summary["aggregates"]["domain chat"]["score"] == pytest.approx(6 / 9)
    assert summary["aggregates"]["domain safety"]["score"] == pytest.approx((0 + 3 / 9) / 2)
    assert summary["aggregates"]["average"]["score"] == pytest.approx((6 / 9 + 1 + 1 / 6) / 3)
    assert summary["subsets"]["chat"]["hard"] == pytest.approx(1 / 3)


def test_rmbench_rejects_a_domain_outside_the_four(tmp_path):
    """The released code splits by `domain.startswith(chat|math|code|safety)` and silently drops
    any other row; here such a row is rejected and counted instead."""
    rows = json.loads((FIXTURES / "rmbench.json").read_text())
    rows.append({**rows[1], "id": "poetry/1", "domain": "poetry"})
    (tmp_path / "rmb.json").write_text(json.dumps(rows))
    summary = run(tmp_path / "out", "rm-bench", tmp_path / "rmb.json")
    assert summary["data"]["rejections"] == {"schema": 2}
    assert summary["n_examples"] == 4
    assert "poetry" not in summary["subsets"]


@pytest.mark.parametrize("fmt", ["parquet", "json", "datasets"])
def test_readers_give_the_same_result(tmp_path, fmt):
    from datasets import Dataset, DatasetDict

    rows = [json.loads(line) for line in (FIXTURES / "rewardbench2.jsonl").read_text().splitlines()]
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = tmp_path / "rb2.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif fmt == "json":
        path = tmp_path / "rb2.json"
        path.write_text(json.dumps(rows))
    else:
        path = tmp_path / "rb2-disk"
        DatasetDict({"test": Dataset.from_list(rows)}).save_to_disk(str(path))
    if fmt == "datasets":
        DatasetDict({"test": Dataset.from_list(rows), "extra": Dataset.from_list(rows[:2])}).save_to_disk(
            str(tmp_path / "two-splits")
        )
        with pytest.raises(UsageError, match="splits extra, test; name one as .*:SPLIT"):
            run(tmp_path / "x", "rewardbench2", tmp_path / "two-splits")
        two = run(tmp_path / "y", "rewardbench2", f"{tmp_path / 'two-splits'}:extra")
        assert two["n_examples"] == 2
    base = run(tmp_path / "a", "rewardbench2", FIXTURES / "rewardbench2.jsonl")
    other = run(tmp_path / "b", "rewardbench2", path)
    assert other["data_sha256"] == base["data_sha256"]
    assert other["aggregates"] == base["aggregates"]


def test_wrong_schema_is_one_line_naming_the_missing_columns(tmp_path, capsys):
    with pytest.raises(UsageError, match=r"not in the RM-Bench schema: missing column\(s\) domain \(found: "):
        run(tmp_path, "rm-bench", FIXTURES / "rewardbench2.jsonl")
    code = main(["eval", "--benchmark", "rewardbench2", "--data", str(FIXTURES / "rewardbench.jsonl"),
                 "--model", str(tmp_path), "--out", str(tmp_path / "o")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "missing column(s) num_correct" in err[0]
    assert not (tmp_path / "o").exists()


def test_truncation_is_counted_and_drop_rejects(tmp_path):
    summary = run(tmp_path / "t", "rewardbench", FIXTURES / "rewardbench.jsonl", max_length=24)
    assert summary["data"]["truncated_examples"] > 0 and summary["data"]["valid"] == 8
    dropped = run(
        tmp_path / "d", "rewardbench", FIXTURES / "rewardbench.jsonl", max_length=24, truncation="drop"
    )
    assert dropped["data"]["rejections"].get("oversize", 0) == summary["data"]["truncated_examples"]


def test_length_bias_and_worst_pairs(tmp_path):
    summary = run(tmp_path, "rewardbench", FIXTURES / "rewardbench.jsonl")
    bias = summary["length_bias"]
    n = sum(bias[k]["comparisons"] for k in ("chosen_longer", "chosen_shorter", "same_length"))
    assert n == 8 and bias["unit"] == "completion tokens"
    worst = json.loads((tmp_path / "worst.json").read_text())
    assert [w["id"] for w in worst] == ["6", "2", "4"]  # wrong margins 1, 0 (tie), 0 (tie)
    assert worst[0]["prompt"] == "What is 3+3?" and worst[0]["rejected"] == "7. score=1"


def test_compare_two_benchmark_outputs(tmp_path, capsys):
    run(tmp_path / "A", "rewardbench2", FIXTURES / "rewardbench2.jsonl")
    # B: the Focus chosen response gains 5 and Factuality's tie breaks the right way
    run(tmp_path / "B", "rewardbench2", FIXTURES / "rewardbench2.jsonl",
        scorer=fake_scorer({"A small furry pet": 5.0, "Paris": 0.5}))  # fmt: skip
    comparison = compare_examples(tmp_path / "A" / "examples.jsonl", tmp_path / "B" / "examples.jsonl",
                                  replicates=REPLICATES)  # fmt: skip
    score = comparison["aggregates"]["score"]
    a = json.loads((tmp_path / "A" / "summary.json").read_text())["aggregates"]["score"]["score"]
    b = json.loads((tmp_path / "B" / "summary.json").read_text())["aggregates"]["score"]["score"]
    assert score["difference"] == pytest.approx(b - a)
    assert (score["discordant_a_only"], score["discordant_b_only"]) == (0, 2)
    assert score["mcnemar_p"] == pytest.approx(0.5)  # 2 · P(X ≤ 0), X ~ Bin(2, ½)
    assert comparison["subsets"]["Focus"]["difference"] == 1.0
    assert 0.0 <= score["bootstrap"]["p_b_greater"] <= 1.0
    code = main(["compare", str(tmp_path / "A"), str(tmp_path / "B" / "examples.jsonl"), "--out", str(tmp_path / "c"),
                 "--replicates", "200"])  # fmt: skip
    assert code == 0 and "McNemar p" in capsys.readouterr().out
    # another benchmark's output or other data is refused
    run(tmp_path / "R", "rewardbench", FIXTURES / "rewardbench.jsonl")
    with pytest.raises(UsageError, match="different benchmarks"):
        compare_examples(tmp_path / "A", tmp_path / "R")
    shutil.copy(FIXTURES / "rewardbench2.jsonl", tmp_path / "less.jsonl")
    lines = (tmp_path / "less.jsonl").read_text().splitlines()[1:]
    (tmp_path / "less.jsonl").write_text("\n".join(lines) + "\n")
    run(tmp_path / "L", "rewardbench2", tmp_path / "less.jsonl")
    with pytest.raises(UsageError, match="different data"):
        compare_examples(tmp_path / "A", tmp_path / "L")


def test_cli_with_a_real_model_scores_each_text_as_alone(tmp_path, capsys):
    """End to end through the checkpoint's scorer: the distinct texts scored on their own in
    length-sorted buckets get the score each gets alone (batch size 1)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from rewardplane.data.records import TokenizedPair
    from rewardplane.data.tokenize import tokenize_branch
    from rewardplane.models.tiny import tiny_config
    from rewardplane.objectives.base import score_in_batches
    from rewardplane.objectives.reward_model import load_scorer

    torch.set_num_threads(1)
    tokenizer = builtin_tokenizer()
    config = tiny_config(
        "tiny-llama", vocab_size=len(tokenizer), num_labels=1, pad_token_id=tokenizer.pad_token_id
    )
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    code = main(["eval", "--benchmark", "rm-bench", "--data", str(FIXTURES / "rmbench.json"), "--model",
                 str(tmp_path / "model"), "--out", str(tmp_path / "out"), "--replicates", "200", "--batch-size", "3",
                 "--device", "cpu"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "RM-Bench average" in out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["throughput"]["distinct_texts"] == 24 and summary["throughput"]["pairs_per_s"] > 0
    assert summary["throughput"]["attention"] == "padded" and summary["throughput"]["dtype"] == "fp32"
    assert summary["throughput"]["real_tokens"] == summary["throughput"]["tokens"]
    row = json.loads((tmp_path / "out" / "examples.jsonl").read_text().splitlines()[0])
    item = json.loads((FIXTURES / "rmbench.json").read_text())[0]
    scorer = load_scorer(tmp_path / "model", device="cpu")
    for side in ("chosen", "rejected"):
        for text, got in zip(item[side], row[f"{side}_scores"], strict=True):
            branch = tokenize_branch(tokenizer, [{"role": "user", "content": item["prompt"]}],
                                     [{"role": "assistant", "content": text}])  # fmt: skip
            alone, _ = scorer.score([TokenizedPair("x", branch, branch)], 1)[:2]
            assert got == pytest.approx(float(alone[0]), abs=1e-5)
    assert score_in_batches  # the one pairs → scores path both went through


@pytest.mark.parametrize(
    "benchmark,data", [("rm-bench", "rmbench.json"), ("rewardbench2", "rewardbench2.jsonl")]
)
def test_benchmark_report(tmp_path, benchmark, data):
    from rewardplane.eval.report import build_report

    run(tmp_path / "ev", benchmark, FIXTURES / data)
    page = build_report(tmp_path / "ev", tmp_path / "out").read_text()
    text = (tmp_path / "out" / "report.md").read_text()
    sections = ["Headline", "Scores with intervals", "Data", "Worst pairs", "Length bias", "Throughput"]
    assert all(f"## {s}" in text for s in sections)
    assert "on 4 examples, against chance" in text or "on 8 examples, against chance" in text
    assert "| rejected | 1 |" in text or "| rejected | 2 |" in text
    assert (benchmark == "rm-bench") == ("## Style bias (RM-Bench)" in text)
    assert (benchmark == "rewardbench2") == ("## Ties terms" in text)
    assert "Explain Schrödinger" in page or "Describe a cat" in page  # worst pairs carry their text
    assert (tmp_path / "out" / "forest.png").is_file()


@pytest.mark.parametrize("make", ["builtin", "llama3_like", "mistral_like"])
def test_batched_tokenisation_equals_one_tokenize_branch_per_text(make, monkeypatch):
    """tokenize_texts renders each prompt once and encodes in large batches: the ids, loss masks
    and read positions equal one `tokenize_branch` call per text (a rejected one is None in both),
    and a batch boundary inside one prompt's responses changes nothing."""
    from rewardplane.data import tokenize as tk
    from support import tokenizers

    tok = builtin_tokenizer() if make == "builtin" else getattr(tokenizers, make)()
    keys = [
        (p, r)
        for p in ("What is 2+2?", "Explain\n\nrecursion.", "naïve café 漢字")
        for r in ("Four.", "\n\nIt calls itself.", " leading space", "", "x" * 40)
    ]
    monkeypatch.setattr(runner, "ENCODE_CHUNK", 4)
    branches, _, _ = runner.tokenize_texts(tok, keys, max_length=10_000, truncation="truncate")
    for (prompt, response), got in zip(keys, branches, strict=True):
        try:
            want = tk.tokenize_branch(
                tok, [{"role": "user", "content": prompt}], [{"role": "assistant", "content": response}]
            )
        except tk.Rejection:
            want = None
        assert got == want, (prompt, response)
    assert sum(b is not None for b in branches) >= 12


def streaming_scorer() -> PairScorer:
    """`fake_scorer` with the chunked entry the reward models have: records each chunk's size."""
    scorer = fake_scorer()
    tok = scorer.tokenizer
    chunks_seen: list[int] = []

    def score_branch_chunks(chunks, progress=None, per_unit=1):
        values = []
        for chunk in chunks:
            chunks_seen.append(len(chunk))
            values += [read_score(tok, b) for b in chunk]
        return np.array(values)

    scorer.score_branch_chunks = score_branch_chunks
    scorer.chunks_seen = chunks_seen  # type: ignore[attr-defined]
    return scorer


def test_texts_tokenised_in_chunks_give_the_result_of_one_chunk(tmp_path, monkeypatch):
    """Tokenising on a thread chunk by chunk while the scorer takes the chunks before changes no
    number: a text first met in an example that is rejected (its other response is too long) and
    needed by a later kept example is still scored, once."""
    rows = [
        {"prompt": "Name a fruit.", "chosen": "plum. score=2", "rejected": "hammer " * 40 + "score=1"},
        {"prompt": "Name a fruit.", "chosen": "plum. score=2", "rejected": "tea. score=1"},
        {"prompt": "Name a tool.", "chosen": "saw. score=3", "rejected": "pear. score=4"},
        {"prompt": "Name a fruit.", "chosen": "fig. score=5", "rejected": "tea. score=1"},
    ]
    data = tmp_path / "rb.jsonl"
    data.write_text("".join(
        json.dumps({**r, "chosen_model": "a", "rejected_model": "b", "subset": "alpacaeval-easy", "id": i}) + "\n"
        for i, r in enumerate(rows)
    ))  # fmt: skip
    results = {}
    for size in (1, 10_000):
        monkeypatch.setattr(runner, "STREAM_ITEMS", size)
        scorer = streaming_scorer()
        summary = run(
            tmp_path / str(size), "rewardbench", data, scorer=scorer, max_length=40, truncation="drop"
        )
        results[size] = (summary, (tmp_path / str(size) / "examples.jsonl").read_text(), scorer.chunks_seen)
    (one, one_rows, one_chunks), (whole, whole_rows, whole_chunks) = results[1], results[10_000]
    assert one_chunks == [0, 2, 2, 1] and whole_chunks == [5]  # "plum" and "tea" sent once each
    assert one["data"]["rejections"] == whole["data"]["rejections"] == {"oversize": 1}
    assert one["data"]["valid"] == 3 and one["throughput"]["distinct_texts"] == 5
    assert one_rows == whole_rows
    assert [json.loads(line)["chosen_scores"] for line in one_rows.splitlines()] == [[2.0], [3.0], [5.0]]
    drop = ("throughput",)
    assert {k: v for k, v in one.items() if k not in drop} == {
        k: v for k, v in whole.items() if k not in drop
    }
