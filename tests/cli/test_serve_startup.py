"""What `rewardplane serve` says when it starts (issue 47): one line once every scorer is ready
(names, kinds, devices, the URL, after uvicorn's own), and one line per scorer that failed."""

from __future__ import annotations

import subprocess
import sys

from rewardplane.bench.server import running_server
from support.dist import free_port


def test_one_line_says_every_scorer_is_ready(tmp_path):
    (tmp_path / "service.yaml").write_text(
        "scorers:\n  - {name: len, kind: length}\n  - {name: em, kind: exact_match}\n"
    )
    with running_server(["--config", str(tmp_path / "service.yaml")], tmp_path, ready_timeout_s=300) as url:
        pass
    lines = (tmp_path / "server.log").read_text().splitlines()
    ready = [line for line in lines if line.startswith("rewardplane: ready:")]
    assert ready == [f"rewardplane: ready: 2 scorers at {url}: len (length, cpu), em (exact_match, cpu)"], (
        lines
    )
    assert lines.index(ready[0]) > next(i for i, line in enumerate(lines) if "Uvicorn running" in line)


def test_each_scorer_that_fails_to_load_gets_its_own_line(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()  # there, but no model in it
    (tmp_path / "service.yaml").write_text(
        "scorers:\n  - {name: a, kind: rm, path: a}\n  - {name: b, kind: rm, path: b}\n  - {name: len, kind: length}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "rewardplane", "serve", "--config", "service.yaml", "--port", str(free_port())],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("rewardplane: error:")]
    assert [line.split(" failed to load")[0] for line in errors] == [
        "rewardplane: error: scorer 'a' (path a)",
        "rewardplane: error: scorer 'b' (path b)",
    ], proc.stderr[-2000:]
    assert "rewardplane: ready" not in proc.stdout and "Traceback" not in proc.stderr
