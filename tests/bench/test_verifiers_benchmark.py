"""benchmarks/verifiers.py's judge-engine section (a GPU benchmark) run end to end on the CPU with
`--smoke`: a tiny scripted Llama behind a real `transformers serve`, straight and through
`/v1/score`, and the in-process backend; every answer must be generated in full and parsed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_judge_engine_smoke_generates_and_parses_every_answer(tmp_path):
    from transformers.utils.import_utils import is_serve_available

    if not is_serve_available():
        pytest.skip("transformers serve needs fastapi, uvicorn and openai")
    out = tmp_path / "judge.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "verifiers.py"),
            "--only",
            "judge_engine",
            "--smoke",
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())["judge_engine"]
    model = res["model"]
    assert model["shape"] == "tiny-llama" and model["answer"].endswith("Score: 7")
    assert res["direct"]["parsed"] == res["direct"]["prompts"] == 8
    assert res["direct_after"]["parsed"] == res["direct_after"]["prompts"] == 8
    # the engine counted exactly the scripted tokens: the answers ran to their end, not max_tokens
    assert res["direct"]["generated_tokens"] == 8 * model["answer_tokens"]
    assert res["one_in_flight"]["parsed"] == res["one_in_flight"]["prompts"]
    for section in ("through_v1_score", "in_process"):
        assert res[section]["parsed"] == res[section]["items"] == 8 and res[section]["errors"] == {}
        assert res[section]["generated_tokens_per_s"] > 0
    assert res["through_over_direct"] > 0 and res["through_over_one_in_flight"] > 0
