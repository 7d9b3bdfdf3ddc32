"""/health/live while a worst-case in-limit item of each scorer kind is scored (issue 44).

A real `rewardplane serve` process on a free loopback port hosts one scorer per kind, a judge
whose engine is a tiny local HTTP server (every answer `Score: 3`), and an `audit:` section that
re-scores every item of its proxy (sample 1.0). For each kind, one request carrying that kind's
worst-case item (a long degenerate run after an opening it never closes) is sent `ROUNDS` times
in a row while a prober calls /health/live every 5 ms; the audited case waits after each request
until the audit has processed the item, so the audit's passes fall inside the probing. Reports
each kind's request time and the liveness p50/p99/max during it (goal: p99 <= 100 ms).

Each probe over `SLOW_MS` is attributed: `gc` when the server was in a garbage collection that
covered most of it (a `sitecustomize` in the server's path logs every collection over 20 ms),
`load` when the prober itself overslept its 5 ms sleep just before by over `SLOW_MS` (the machine
had no core for either process), else `server` (its event loop or its share of the CPU).

    PYTHONPATH=$PWD/src nice -n 10 python benchmarks/liveness.py --out docs/benchmarks/liveness.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from rewardplane.bench.server import running_server

ROUNDS = 20
"""Requests per kind, one after another, while the prober runs (enough probes for a p99)."""
N = 100_000
"""Characters of each worst-case response (far inside the 32 MiB body limit)."""
SLOW_MS = 100.0
"""A probe slower than this (the goal) is attributed to a cause."""

CASES = {
    "regex": ("fmt", "x <" + " " * N, None),
    "exact_match": ("em", "a " * (N // 2), "a"),
    "length": ("words", " \n" * (N // 2), None),
    "code fence": ("code", "```" + "a" * N, {"inputs": ["1\n"], "outputs": ["1\n"]}),
    "math boxes": ("math", "\\boxed{" * (N // 7), "4"),
    "judge fence": ("judge", "x <" + " " * N, "Paris."),
    "audit boxes": ("len", "\\boxed{" * 4_000, None),
}
AUDITED = {"audit boxes"}
"""Cases whose request is followed by the audit's passes over the item."""
GC_LOG = """import gc, os, time
_log = open(os.environ["LIVENESS_GC_LOG"], "a", buffering=1)
_t = {}
def _cb(phase, info):
    if phase == "start":
        _t["s"] = time.time()
    elif time.time() - _t.get("s", time.time()) > 0.02:
        _log.write(f"{_t['s']} {time.time()} {info['generation']}\\n")
gc.callbacks.append(_cb)
"""
"""The server's `sitecustomize`: every garbage collection over 20 ms, as wall-clock start/end."""


class FixedJudge(BaseHTTPRequestHandler):
    """An OpenAI-compatible engine that answers every judge prompt `Score: 3` at once."""

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        message = {"role": "assistant", "content": "Weak.\nScore: 3"}
        data = json.dumps({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def config(judge_url: str) -> dict:
    judge = {"url": judge_url, "model": "m", "max_retries": 0}
    return {
        "scorers": [
            {"name": "fmt", "kind": "regex", "options": {"pattern": r"\s*/?\s*(?:response|prompt)\b"}},
            {"name": "em", "kind": "exact_match"},
            {"name": "words", "kind": "length", "options": {"unit": "words"}},
            {"name": "len", "kind": "length"},
            {"name": "code", "kind": "code", "options": {"concurrency": 1, "prefork": 1}},
            {"name": "math", "kind": "math", "options": {"workers": 1}},
            {"name": "judge", "kind": "judge", "options": judge},
        ],
        "audit": {"proxy": "len", "auditors": ["words"], "sample": 1.0, "batch_wait_s": 0},
    }


def audited(client: httpx.Client, url: str) -> int:
    return client.get(url + "/v1/audit").json()["counts"]["audited"]


def send_rounds(url: str, body: dict, audit: bool, result: dict) -> None:
    seconds, statuses = [], set()
    with httpx.Client(timeout=300) as c:
        for version in range(ROUNDS):
            before = audited(c, url) if audit else 0
            items = [{**item, "metadata": {"policy_version": version}} for item in body["items"]]
            started = time.perf_counter()
            statuses.add(c.post(url + "/v1/score", json={**body, "items": items}).status_code)
            while audit and audited(c, url) <= before:  # the audit's passes, inside the probing
                if time.perf_counter() - started > 120:
                    raise RuntimeError("the audit did not process the item within 120 s")
                time.sleep(0.01)
            seconds.append(time.perf_counter() - started)
    result["s"], result["status"] = statistics.median(seconds), sorted(statuses)


def probe_during(url: str, body: dict, audit: bool) -> tuple[dict, list[tuple[float, float, float]]]:
    """Probes while the rounds run: (wall-clock sent, seconds, the sleep's overshoot before)."""
    result: dict = {}
    thread = threading.Thread(target=send_rounds, args=(url, body, audit, result))
    probes = []
    overshoot = 0.0
    with httpx.Client(timeout=300) as client:
        thread.start()
        while thread.is_alive():
            sent, t = time.time(), time.perf_counter()
            client.get(url + "/health/live")
            probes.append((sent, time.perf_counter() - t, overshoot))
            t = time.perf_counter()
            time.sleep(0.005)
            overshoot = time.perf_counter() - t - 0.005
    thread.join()
    return result, probes


def causes(probes: list[tuple[float, float, float]], gcs: list[tuple[float, float]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for sent, seconds, overshoot in probes:
        if seconds * 1000 <= SLOW_MS:
            continue
        in_gc = sum(max(0.0, min(end, sent + seconds) - max(start, sent)) for start, end in gcs)
        cause = "gc" if in_gc > seconds / 2 else "load" if overshoot * 1000 > SLOW_MS else "server"
        out[cause] = out.get(cause, 0) + 1
    return out


def row(result: dict, probes: list[tuple[float, float, float]], gcs: list[tuple[float, float]]) -> dict:
    lat_ms = sorted(p[1] * 1000 for p in probes)
    p99 = lat_ms[min(len(lat_ms) - 1, int(0.99 * len(lat_ms)))]
    return {
        "status": result["status"],
        "request_s_median": round(result["s"], 3),
        "probes": len(lat_ms),
        "live_p50_ms": round(statistics.median(lat_ms), 1),
        "live_p99_ms": round(p99, 1),
        "live_max_ms": round(lat_ms[-1], 1),
        "over_goal": causes(probes, gcs),
        "prober_overshoot_max_ms": round(max(p[2] for p in probes) * 1000, 1),
    }


def run(tmp: Path, judge_url: str) -> dict:
    cfg, gc_log = tmp / "service.yaml", tmp / "gc.log"
    cfg.write_text(json.dumps(config(judge_url)))
    (tmp / "site").mkdir()
    (tmp / "site" / "sitecustomize.py").write_text(GC_LOG)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp / "site"), os.environ.get("PYTHONPATH", "")]),
           "LIVENESS_GC_LOG": str(gc_log)}  # fmt: skip
    rows = {}
    with running_server(["--config", str(cfg)], tmp, env=env, ready_timeout_s=300) as url:
        for kind, (scorer, response, reference) in CASES.items():
            item = {"id": "worst", "prompt": "p", "response": response, "reference": reference}
            result, probes = probe_during(url, {"scorers": [scorer], "items": [item]}, kind in AUDITED)
            gcs = [tuple(map(float, line.split()[:2])) for line in gc_log.read_text().splitlines()]
            rows[kind] = row(result, probes, gcs)
            print(kind, rows[kind], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    engine = ThreadingHTTPServer(("127.0.0.1", 0), FixedJudge)
    engine.daemon_threads = True
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    load_before = os.getloadavg()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rows = run(Path(tmp), f"http://127.0.0.1:{engine.server_address[1]}")
    finally:
        engine.shutdown()
        engine.server_close()
    out = {
        "rows": rows,
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
