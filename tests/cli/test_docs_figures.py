"""The numbers the docs quote are what the commands print today: docs/data.md's console block
(counts, probe hashes), demo_rm.yaml's accuracy and docs/evaluation.md's training-overlap example."""

from __future__ import annotations

import json
import re

import pytest
import torch

from rewardplane.cli import main
from support.docs import ROOT, console_steps, fenced, section

torch.set_num_threads(1)


def _run(argv, capsys) -> tuple[int, list[str]]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, (captured.out + captured.err).splitlines()


def _in_order(expected: list[str], printed: list[str]) -> None:
    """Every line the docs show is printed, in the docs' order (progress and logging may interleave)."""
    position = 0
    for line in expected:
        assert line in printed[position:], f"the docs show {line!r}; the command printed {printed}"
        position = printed.index(line, position) + 1


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A scratch directory that sees the repository's `src/` as the docs' commands do."""
    root = tmp_path_factory.mktemp("docs")
    (root / "src").symlink_to(ROOT / "src")
    return root


def test_data_md_console_block_prints_what_it_shows(workdir, capsys, monkeypatch):
    monkeypatch.chdir(workdir)
    block = fenced(section(ROOT / "docs" / "data.md", "## Commands"), "console")[0]
    steps = console_steps(block)
    assert [argv[:2] for argv, _ in steps if argv != ["echo"]] == [
        ["data", "synth"], ["data", "validate"], ["data", "prepare"], ["data", "freeze-probe"]
    ]  # fmt: skip
    last = None
    for argv, expected in steps:
        if argv == ["echo"]:
            assert expected == [str(last)]
            continue
        last, printed = _run(argv, capsys)
        _in_order(expected, printed)


def test_demo_config_accuracy_and_the_overlap_example(workdir, capsys, monkeypatch):
    """demo_rm.yaml alone trains on `data synth`'s default rows: its header's accuracy is the run's,
    and docs/evaluation.md's example (that model on the tour's data/) prints what it shows."""
    monkeypatch.chdir(workdir)
    if not (workdir / "data" / "probe.json").is_file():
        for argv, _ in console_steps(fenced(section(ROOT / "docs" / "data.md", "## Commands"), "console")[0]):
            if argv != ["echo"]:
                _run(argv, capsys)
    header = " ".join(
        line.lstrip("# ") for line in (ROOT / "src/rewardplane/configs/demo_rm.yaml").read_text().splitlines()
        if line.startswith("#")
    )  # fmt: skip
    quoted = re.search(r"held-out accuracy (0\.\d+)", header).group(1)
    block = fenced(
        section(ROOT / "docs" / "evaluation.md", "### Training overlap: pairs the model was trained on"),
        "console",
    )[0]
    (train, _), (evaluate, expected) = console_steps(block)
    code, printed = _run(train, capsys)
    assert code == 0
    accuracy = json.loads(next(line for line in reversed(printed) if line.startswith("{")))["final_accuracy"]
    assert f"{accuracy:.{len(quoted) - 2}f}" == quoted
    code, printed = _run(evaluate, capsys)
    assert code == 0
    _in_order(expected, printed)
