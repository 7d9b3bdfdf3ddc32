"""`rewardplane eval` end to end on a tiny HF sequence-classification model and the synth task."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from rewardplane.cli import main
from rewardplane.data.probe import freeze_probe
from rewardplane.data.synth import builtin_tokenizer, generate_rows
from rewardplane.data.tokenize import TokenizeSettings
from rewardplane.eval.artifacts import read_pairs
from rewardplane.eval.runner import tokenize_eval_data
from rewardplane.objectives.base import PairScorer
from rewardplane.objectives.reward_model import load_scorer

N_PAIRS = 48


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import torch
    from transformers import AutoModelForSequenceClassification

    from rewardplane.models.tiny import tiny_config

    torch.set_num_threads(1)  # 2 shared cores: intra-op threads only contend (20x slower at batch size 1)
    root = tmp_path_factory.mktemp("eval")
    tokenizer = builtin_tokenizer()
    config = tiny_config(
        "tiny-llama", vocab_size=len(tokenizer), num_labels=1, pad_token_id=tokenizer.pad_token_id
    )
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    rows = generate_rows(N_PAIRS, seed=3)
    data = root / "eval.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    pairs = tokenize_eval_data(data, tokenizer, TokenizeSettings())
    probe = freeze_probe(pairs, tokenizer, TokenizeSettings())
    (root / "probe.json").write_text(json.dumps(probe))
    return root, rows, probe


def _first_plain(rows):
    return next(row for row in rows if isinstance(row["chosen"], str))


def _reworded(row):
    return {**row, "chosen": row["chosen"] + " Indeed."}


def _eval(root, out, *extra, data=None):
    args = ["eval", "--model", str(root / "model"), "--probe", str(root / "probe.json")]
    args += ["--data", str(data or root / "eval.jsonl"), "--out", str(out), "--replicates", "200", *extra]
    return main(args)


def test_eval_writes_artifacts_in_probe_order(setup, tmp_path, capsys):
    root, _, probe = setup
    assert _eval(root, tmp_path / "out") == 0
    assert "accuracy" in capsys.readouterr().out
    rows = read_pairs(tmp_path / "out" / "pairs.jsonl")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [r["pair_id"] for r in rows] == probe["pair_ids"]
    assert summary["probe_sha256"] == probe["tokens_sha256"] == rows[0]["probe_sha256"]
    assert summary["n_pairs"] == N_PAIRS and summary["objective"] == "reward_model"
    assert set(summary["subsets"]) == {r["subset"] for r in rows} - {None}
    assert summary["model"]["head_type"] == "hf_seqcls"
    assert summary["batch_plan"]["layout"] == "right" and summary["batch_plan"]["precision"] == "fp32"
    throughput = json.loads((tmp_path / "out" / "throughput.json").read_text())
    assert throughput["path"] == "padded, length-sorted buckets" and throughput["device"] == "cpu"
    assert throughput["computed_tokens"] == throughput["real_tokens"] + throughput["padding_tokens"]


def test_scores_do_not_depend_on_batch_size(setup):
    root, _, _ = setup
    scorer = load_scorer(root / "model", device="cpu")
    pairs = tokenize_eval_data(root / "eval.jsonl", scorer.tokenizer, TokenizeSettings())
    scores = {}
    for batch_size in (1, 7, 64):
        chosen, rejected, losses = scorer.score(pairs, batch_size)
        assert losses is None  # reward models: Bradley–Terry loss from the margin
        scores[batch_size] = np.stack([chosen, rejected])
    assert np.ptp(scores[1]) > 1e-3  # a model that scores everything alike would pass trivially
    np.testing.assert_allclose(scores[7], scores[1], atol=1e-5, rtol=0)
    np.testing.assert_allclose(scores[64], scores[1], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda rows: rows[:-1], "count differs"),
        (lambda rows: [rows[1], rows[0], *rows[2:]], "pair id differs at position 0"),
        (
            lambda rows: [_reworded(row) if row is _first_plain(rows) else row for row in rows],
            "tokens differ for pair",
        ),
    ],
)
def test_data_that_does_not_match_the_probe_is_refused(setup, tmp_path, capsys, edit, message):
    root, rows, _ = setup
    data = tmp_path / "other.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in edit(rows)))
    assert _eval(root, tmp_path / "out", data=data) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_rewardplane_checkpoint_reproduces_the_training_evaluation(tmp_path):
    """Training's final evaluation and `rewardplane eval` of its checkpoint are the same measurement."""
    from rewardplane.train.config import load_config
    from rewardplane.train.recipe import run

    settings = TokenizeSettings(max_length=96, max_completion_length=48)
    overrides = [
        "model.tiny=tiny-llama", "data.tokenizer=builtin", "data.synth.train_rows=32", "data.synth.eval_rows=12",
        f"data.max_length={settings.max_length}", f"data.max_completion_length={settings.max_completion_length}",
        "run.max_steps=2", "run.global_batch_pairs=8", "run.layout=packed", "run.eval_batch_size=5",
        "run.progress=false", f"run.run_dir={tmp_path / 'run'}",
    ]  # fmt: skip
    result = run(load_config(None, overrides))
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in generate_rows(44, seed=0)[32:]))
    tokenizer = builtin_tokenizer()
    probe = freeze_probe(tokenize_eval_data(data, tokenizer, settings), tokenizer, settings)
    (tmp_path / "probe.json").write_text(json.dumps(probe))
    args = [
        "eval",
        "--model",
        str(result.checkpoint),
        "--probe",
        str(tmp_path / "probe.json"),
        "--data",
        str(data),
    ]
    assert main([*args, "--out", str(tmp_path / "out"), "--replicates", "100"]) == 0
    ours = read_pairs(tmp_path / "out" / "pairs.jsonl")
    training = read_pairs(tmp_path / "run" / "eval" / "step-0000002" / "pairs.jsonl")
    assert [r["pair_id"] for r in ours] == [r["pair_id"] for r in training]
    assert ours[0]["probe_sha256"] == training[0]["probe_sha256"]
    # packed batches of 5 in training, right-padded batches of 16 here
    for key in ("chosen_score", "rejected_score"):
        np.testing.assert_allclose([r[key] for r in ours], [r[key] for r in training], atol=1e-5, rtol=0)


def test_not_a_model_and_non_finite_scores_are_one_line_errors(setup, tmp_path, capsys, monkeypatch):
    from rewardplane.objectives import registry

    root, _, _ = setup
    args = [
        "eval",
        "--probe",
        str(root / "probe.json"),
        "--data",
        str(root / "eval.jsonl"),
        "--out",
        str(tmp_path),
    ]
    assert main([*args, "--model", str(tmp_path)]) == 2
    assert "neither a rewardplane checkpoint nor an HF" in capsys.readouterr().err

    real = registry.spec("reward_model").resolve("load_scorer")

    def broken(path, **kwargs):
        scorer = real(path, **kwargs)
        scores = scorer.score

        def score(pairs, batch_size, progress=None):
            chosen, rejected, losses = scores(pairs, batch_size, progress)
            chosen[3] = np.nan
            return chosen, rejected, losses

        return PairScorer(scorer.objective, scorer.tokenizer, scorer.metadata, score)

    spec = dataclasses.replace(registry.spec("reward_model"), load_scorer=broken)
    monkeypatch.setitem(registry.OBJECTIVES, "reward_model", spec)
    assert main([*args, "--model", str(root / "model")]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # above it: transformers' loading bar
    assert last.startswith("rewardplane: error: model gave 1 non-finite chosen value(s)")
    assert not (tmp_path / "pairs.jsonl").exists()


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("rewardplane: error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_missing_and_corrupt_models_are_one_line_errors(setup, tmp_path, capsys):
    """A model path that does not exist, a corrupt rewardplane.json, a corrupt config.json and
    truncated weights: each is one `rewardplane: error:` line and exit 2, never a traceback."""
    import shutil

    root, _, _ = setup
    args = ["eval", "--probe", str(root / "probe.json"), "--data", str(root / "eval.jsonl")]
    args += ["--out", str(tmp_path / "out")]
    assert main([*args, "--model", str(tmp_path / "no-such-model")]) == 2
    assert "no-such-model does not exist" in _one_line_error(capsys)

    bad_meta = tmp_path / "bad-meta"
    bad_meta.mkdir()
    (bad_meta / "rewardplane.json").write_text("{not json")
    assert main([*args, "--model", str(bad_meta)]) == 2
    assert "rewardplane.json: not valid JSON" in _one_line_error(capsys)

    bad_config = tmp_path / "bad-config"
    shutil.copytree(root / "model", bad_config)
    (bad_config / "config.json").write_text('{"architectures": ')
    assert main([*args, "--model", str(bad_config)]) == 2
    assert "config.json: not valid JSON" in _one_line_error(capsys)

    truncated = tmp_path / "truncated"
    shutil.copytree(root / "model", truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert main([*args, "--model", str(truncated)]) == 2
    assert "cannot load the model" in _one_line_error(capsys)
    assert not (tmp_path / "out").exists()


def test_plain_text_tokenised_otherwise_than_the_model_was_trained_is_refused(setup, tmp_path, capsys):
    """The HF model reads plain-text rows as TRL does (`text_eos`). A probe frozen before the
    setting existed (no `plain_text`: `chat_template`) would feed it template-rendered plain rows:
    refused in one line naming the fix. On conversations alone the setting changes no token, so
    the same old probe evaluates."""
    root, rows, _ = setup
    legacy = TokenizeSettings(plain_text="chat_template")
    tokenizer = builtin_tokenizer()

    def old_probe(name, data_rows):
        data = tmp_path / f"{name}.jsonl"
        data.write_text("".join(json.dumps(row) + "\n" for row in data_rows))
        probe = freeze_probe(tokenize_eval_data(data, tokenizer, legacy), tokenizer, legacy)
        del probe["settings"]["plain_text"]  # as written before the key existed
        del probe["contract_sha256"]  # (and before the contract hash)
        (tmp_path / f"{name}.probe.json").write_text(json.dumps(probe))
        args = ["eval", "--model", str(root / "model"), "--probe", str(tmp_path / f"{name}.probe.json")]
        return [*args, "--data", str(data), "--out", str(tmp_path / name), "--replicates", "50"]

    assert any(isinstance(row["chosen"], str) for row in rows)
    assert main(old_probe("mixed", rows)) == 2
    line = _one_line_error(capsys)
    assert "trained with plain-text rows tokenised as 'text_eos' but the probe tokenises them as" in line
    assert "freeze-probe --plain-text text_eos" in line
    conversations = [row for row in rows if not isinstance(row["chosen"], str)]
    assert main(old_probe("conversations", conversations)) == 0


def test_progress_without_a_terminal_is_a_bounded_number_of_lines(setup, tmp_path, capsys):
    """On a pipe or a log file, scoring progress is one line per interval plus one at the end
    (never one per batch refresh); `--no-progress` prints none."""
    root, _, _ = setup

    def progress_lines(*extra):
        assert _eval(root, tmp_path / f"out{len(extra)}", "--batch-size", "4", *extra) == 0
        return [line for line in capsys.readouterr().err.splitlines() if line.startswith("eval:")]

    lines = progress_lines()  # default interval, 30 s: far longer than this evaluation
    assert len(lines) == 1 and lines[0].startswith(f"eval: {N_PAIRS}/{N_PAIRS} pair (100%)")
    assert "done in" in lines[0]
    # an interval shorter than a batch: at most one line per batch (12 of 4 pairs) and the last
    lines = progress_lines("--progress-every", "1e-9")
    assert 2 <= len(lines) <= N_PAIRS // 4 + 1 and lines[-1].startswith(f"eval: {N_PAIRS}/{N_PAIRS}")
    assert progress_lines("--no-progress") == []
