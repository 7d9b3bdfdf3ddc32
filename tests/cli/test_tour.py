"""The README tour, every `rewardplane` line of it run as written (with small sizes) under umask
022, top to bottom: its evaluation is not on its own training pairs, everything it writes lies
under tour/ (ignored by git), and every file is readable by a teammate (0644, folders 0755)."""

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

# commands of the tour that need a running service (docs/serve.md's tests start one) or GPUs
PLACEHOLDERS = ("service.yaml", "deploy.yaml", "--url", "qualify")
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
    if out[0] == "train":
        out += [f"run.max_steps={STEPS}", "run.progress=false"]
    return out


@pytest.fixture(scope="module")
def tour(tmp_path_factory):
    root = tmp_path_factory.mktemp("tour")
    for shared in ("src", "tests"):  # the configs, and the benchmark sample the tour scores
        (root / shared).symlink_to(ROOT / shared)
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
        "train dpo",
        "eval --model",
        "compare tour/ev/A/pairs.jsonl",
        "eval --benchmark",
        "report tour/runs/rm",
        "report tour/ev/A-vs-B",
    ):
        assert expected in ran
    assert ran.count("train rm") == 2 and ran.count("eval --model") == 2  # models A and B
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
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
        for name in dirnames:
            if stat.S_IMODE(os.stat(os.path.join(dirpath, name)).st_mode) != 0o755:
                wrong.append(os.path.join(dirpath, name))
        for name in filenames:
            if stat.S_IMODE(os.stat(os.path.join(dirpath, name)).st_mode) != 0o644:
                wrong.append(os.path.join(dirpath, name))
    assert not wrong
    written = {p.relative_to(root).parts[0] for p in root.rglob("*") if p.is_file()}
    assert written == {"tour"}  # one folder, in .gitignore
    assert "tour/" in (ROOT / ".gitignore").read_text().splitlines()
