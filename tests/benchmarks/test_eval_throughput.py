"""benchmarks/eval_throughput.py's CPU smoke mode runs end to end (so the H200 run cannot rot):
the shipped eval command and serve_text.py's ceiling on the same sequences, JSON written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_mode_measures_eval_and_the_ceiling_on_the_same_texts(tmp_path):
    out = tmp_path / "smoke.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "eval_throughput.py"), "--smoke", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ceiling (c+)" in proc.stdout  # progress lines as it goes
    result = json.loads(out.read_text())
    assert result["corpus"]["items"] == 12 and result["corpus"]["completions"] == 48
    assert 10 <= result["corpus"]["median_tokens"] <= 204  # the smoke's 0.1-scaled [64, 2048]
    record = result["eval"]["throughput_record"]
    assert record["attention"] == "padded" and record["dtype"] == "fp32" and record["device"] == "cpu"
    assert record["real_tokens"] == result["corpus"]["tokens"]
    for timing in (result["eval"]["scoring"], result["eval"]["end_to_end"], *result["ceiling"].values()):
        assert (
            timing["completions_per_s"] == pytest.approx(4 * timing["items_per_s"]) and timing["seconds"] > 0
        )
    assert result["ceiling"]["c+"]["saved_tokens"] > 0 == result["ceiling"]["c"]["saved_tokens"]
    assert set(result["ratios"]) == {
        f"eval_{kind}_over_ceiling_{name}" for kind in ("scoring", "end_to_end") for name in ("c", "c+")
    }
