"""A deploy worker that stops answering (SIGSTOP) is lost within 10 s (issue 23, contract line 7).

Through a real `rewardplane serve --deploy` process: the supervisor's heartbeat (a `health` call
every second) finds no answer for `lost_after_s` (5 s), fails the worker's in-flight items with
`worker_lost` at once, drops readiness, kills the stopped process and starts a replacement (its
start-up time is printed, not asserted: it is the machine's import speed). A worker whose scorer is merely busy for longer than that (its event
loop still answers) is not lost.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import yaml

from rewardplane.bench.server import running_server
from support.deploy_fakes import pid_alive

TESTS = Path(__file__).resolve().parents[1]


def until_at_worker(url: str, scorer: str, items: int, ceiling_s: float = 60.0) -> None:
    """Until the gateway counts `items` of `scorer` forwarded to its worker and unanswered
    (`rewardplane_queue_depth`), instead of a sleep that a loaded machine can outrun."""
    deadline = time.monotonic() + ceiling_s
    line = f'rewardplane_queue_depth{{scorer="{scorer}"}} {float(items)}'
    while line not in httpx.get(url + "/metrics", timeout=30).text:
        assert time.monotonic() < deadline, f"{scorer}: {items} items never reached the worker"
        time.sleep(0.02)


def test_a_stopped_worker_is_lost_within_10s_and_replaced(tmp_path):
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(
        yaml.safe_dump(
            {
                "mode": "dedicated",
                "imports": ["support.deploy_fakes"],
                "scorers": [
                    {"name": "slow", "kind": "rk_test_sleep", "max_wait_ms": 1, "options": {"delay_s": 6.5}},
                    {"name": "len", "kind": "length"},
                ],
            }
        )
    )
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    body = {
        "scorers": ["slow", "len"],
        "items": [{"id": "a", "response": "abc"}, {"id": "b", "response": "de"}],
    }
    stopped_pid = None
    with running_server(["--deploy", str(deploy)], tmp_path, env=env, ready_timeout_s=300) as url:
        try:

            def post() -> tuple[float, httpx.Response]:
                started = time.monotonic()
                r = httpx.post(url + "/v1/score", json=body, timeout=120)
                return time.monotonic() - started, r

            def worker_pid() -> int:
                dep = httpx.get(url + "/v1/deployment").json()
                return next(w["pid"] for w in dep["workers"] if w["name"] == "slow")

            # busy for 6.5 s (longer than lost_after_s) but alive: scored, not lost
            took, r = post()
            assert r.status_code == 200, r.text
            assert [x["scores"].get("slow") for x in r.json()["results"]] == [3.0, 2.0], r.text
            assert took > 6

            stopped_pid = worker_pid()
            with ThreadPoolExecutor(1) as pool:
                pending = pool.submit(post)
                until_at_worker(url, "slow", 2)  # the gateway has sent both items to the worker
                os.kill(stopped_pid, signal.SIGSTOP)
                stopped_at = time.monotonic()
                not_ready_after = None
                while time.monotonic() - stopped_at < 15:
                    if not_ready_after is None and httpx.get(url + "/health/ready").status_code == 503:
                        not_ready_after = time.monotonic() - stopped_at
                    if pending.done() and not_ready_after is not None:
                        break
                    time.sleep(0.1)
                _, r = pending.result(timeout=30)
                answered_after = time.monotonic() - stopped_at
            assert r.status_code == 200, r.text
            results = r.json()["results"]
            assert [x["errors"]["slow"]["code"] for x in results] == ["worker_lost", "worker_lost"]
            assert [x["scores"]["len"] for x in results] == [3.0, 2.0]  # the other worker is untouched
            assert "slow" not in results[0]["scores"]
            assert answered_after < 10, answered_after
            assert not_ready_after is not None and not_ready_after < 10, not_ready_after

            # the replacement imports and warms up its scorer afresh: its start-up is the
            # machine's speed (printed below), so only a ceiling for a starved machine is asserted
            deadline = stopped_at + 300
            while httpx.get(url + "/health/ready", timeout=30).status_code != 200:
                assert time.monotonic() < deadline, "no replacement ready within 300 s"
                time.sleep(0.1)
            ready_after = time.monotonic() - stopped_at
            dep = httpx.get(url + "/v1/deployment").json()
            slow = next(w for w in dep["workers"] if w["name"] == "slow")
            assert slow["restarts"] == 1 and slow["pid"] != stopped_pid and slow["state"] == "ready"
            assert not pid_alive(stopped_pid)  # the stopped process was killed, not left behind
            took, r = post()
            assert r.status_code == 200 and [x["scores"]["slow"] for x in r.json()["results"]] == [3.0, 2.0]
            print(
                f"\nSIGSTOP: items answered worker_lost after {answered_after:.1f} s, /health/ready 503 "
                f"after {not_ready_after:.1f} s, replacement ready after {ready_after:.1f} s"
            )
        finally:
            if stopped_pid is not None and pid_alive(stopped_pid):  # never leave it stopped
                os.kill(stopped_pid, signal.SIGCONT)
