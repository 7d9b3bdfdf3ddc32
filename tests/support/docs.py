"""Commands as the docs print them: the README tour's bash blocks and the docs' console blocks."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def section(path: Path, heading: str) -> str:
    """The text of the markdown section `heading` (`## Tour`), up to the next heading of its level."""
    text = path.read_text(encoding="utf-8")
    level = heading.split()[0]
    start = text.index(f"\n{heading}\n")
    end = re.search(rf"\n{level} ", text[start + 1 :])
    return text[start : start + 1 + end.start()] if end else text[start:]


def fenced(text: str, language: str) -> list[str]:
    """The bodies of the ```language blocks of `text`, in order."""
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def bash_commands(block: str) -> list[str]:
    """Commands of a bash block: continuation lines joined, comments and blank lines dropped."""
    commands, current = [], ""
    for line in block.splitlines():
        code = line.split("  #", 1)[0].rstrip() if not line.lstrip().startswith("#") else ""
        current += code.rstrip("\\").strip() + " " if code else ""
        if code and not code.endswith("\\"):
            commands.append(current.strip())
            current = ""
    return commands


def console_steps(block: str) -> list[tuple[list[str], list[str]]]:
    """(argv after `rewardplane`, the lines printed after it) for each `$ rewardplane ...` of a console
    block; `$ echo $?` becomes (["echo"], [the exit code])."""
    steps: list[tuple[list[str], list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            words = shlex.split(line[2:].split("  #", 1)[0])
            steps.append((words[1:] if words[0] == "rewardplane" else ["echo"], []))
        elif steps:
            steps[-1][1].append(line)
    return steps
