"""The README tour, run as written (with small sizes) under umask 022: its evaluation is not on
its own training pairs, and every file it writes is readable by a teammate (0644, folders 0755)."""

from __future__ import annotations

import json
import os
import shlex
import stat

import pytest
import torch

from rewardplane.cli import main
from support.docs import ROOT, bash_commands, fenced, section

torch.set_num_threads(1)

# commands of the tour that need what it does not build (another model, a service, a benchmark file)
PLACEHOLDERS = ("cfg.yaml", "CKPT", "ev/B", "rb2.parquet", "service.yaml", "deploy.yaml", "--url", "qualify")
SMALL = {"--n": "150", "--eval-size": "20"}
STEPS = 2


def tour_commands() -> list[list[str]]:
    commands = []
    for block in fenced(section(ROOT / "README.md", "## Tour"), "bash"):
        for command in bash_commands(block):
            words = shlex.split(command)
            if words[0] == "rewardplane" and not any(p in command for p in PLACEHOLDERS):
                commands.append(words[1:])
    return commands


def _small(argv: list[str]) -> list[str]:
    out = [SMALL.get(argv[i - 1], word) if i else word for i, word in enumerate(argv)]
    out = [word.replace("step-0000400", f"step-{STEPS:07d}") for word in out]
    if out[:2] == ["train", "rm"]:
        out += [f"run.max_steps={STEPS}", "run.progress=false"]
    return out


@pytest.fixture(scope="module")
def tour(tmp_path_factory):
    root = tmp_path_factory.mktemp("tour")
    (root / "src").symlink_to(ROOT / "src")
    commands = tour_commands()
    previous_dir, previous_mask = os.getcwd(), os.umask(0o022)
    try:
        os.chdir(root)
        codes = [(argv, main(_small(argv))) for argv in commands]
    finally:
        os.chdir(previous_dir)
        os.umask(previous_mask)
    return root, codes


def test_the_tour_runs_as_documented(tour):
    _, codes = tour
    ran = [" ".join(argv[:2]) for argv, _ in codes]
    for expected in (
        "data synth",
        "data prepare",
        "data freeze-probe",
        "train rm",
        "export hf",
        "eval --model",
        "report runs/rm",
    ):
        assert expected in ran
    for argv, code in codes:
        assert code == (1 if argv[:2] == ["data", "validate"] else 0), argv  # validate: the corrupt rows


def test_the_tour_evaluates_on_pairs_it_did_not_train_on(tour):
    root, codes = tour
    out = next(argv[argv.index("--out") + 1] for argv, _ in codes if argv[0] == "eval")
    summary = json.loads((root / out / "summary.json").read_text())
    assert summary["train_overlap"]["checked"] is True
    assert summary["train_overlap"]["pairs"] == 0


def test_every_artifact_of_the_tour_honours_the_umask(tour):
    root, _ = tour
    wrong = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not (root / d).is_symlink()]
        for name in dirnames:
            if stat.S_IMODE(os.stat(os.path.join(dirpath, name)).st_mode) != 0o755:
                wrong.append(os.path.join(dirpath, name))
        for name in filenames:
            if stat.S_IMODE(os.stat(os.path.join(dirpath, name)).st_mode) != 0o644:
                wrong.append(os.path.join(dirpath, name))
    assert not wrong
    written = {p.relative_to(root).parts[0] for p in root.rglob("*") if p.is_file()}
    assert {"data", "runs", "out", "ev", "synth.jsonl", "rejects.jsonl"} <= written
