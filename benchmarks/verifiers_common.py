"""What benchmarks/verifiers.py's sections share: the filler words of long answers, percentiles,
a served `rewardplane serve` subprocess, and the CPU time of a process and its children."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

from rewardplane.bench.server import running_server

WORDS = [
    "we",
    "consider",
    "the",
    "expression",
    "and",
    "simplify",
    "each",
    "term",
    "carefully",
    "noting",
    "that",
    "the",
    "sum",
    "of",
    "the",
    "first",
    "terms",
    "telescopes",
    "so",
    "the",
    "remaining",
    "factor",
    "is",
    "what",
    "we",
    "need",
    "therefore",
    "substituting",
    "back",
    "gives",
]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process so far (Linux /proc; 0.0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


@contextlib.contextmanager
def served(cfg: dict):
    """`rewardplane serve --config` for `cfg`, through the project's one server lifecycle; yields its URL."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "service.yaml"
        path.write_text(json.dumps(cfg))  # JSON is YAML
        with running_server(["--config", str(path)], Path(tmp), ready_timeout_s=120) as url:
            yield url
