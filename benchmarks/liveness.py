"""/health/live while a worst-case in-limit item of each scorer kind is scored (issue 44).

Each kind's request is sent `ROUNDS` times in a row.

A real `rewardplane serve` process on a free loopback port hosts one scorer per kind; for each
kind, one request carries that kind's worst-case item (a long degenerate run after an opening it
never closes), and a prober calls /health/live every 5 ms until the request is answered. Reports
each kind's request time and the liveness p50/p99/max during it (goal: p99 <= 100 ms).

    PYTHONPATH=$PWD/src nice -n 10 python benchmarks/liveness.py --out docs/benchmarks/liveness.json

Not covered here: the judge (needs an engine; tests/security drives a fake one) and the audit's
sampled boxes (needs an audit section); see docs/benchmarks/liveness.md.
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
from pathlib import Path

import httpx

from rewardplane.bench.server import running_server

ROUNDS = 20
"""Requests per kind, one after another, while the prober runs (enough probes for a p99)."""
N = 100_000
"""Characters of each worst-case response (far inside the 32 MiB body limit)."""

CASES = {
    "regex": ("fmt", "x <" + " " * N, None),
    "exact_match": ("em", "a " * (N // 2), "a"),
    "length": ("words", " \n" * (N // 2), None),
    "code fence": ("code", "```" + "a" * N, {"inputs": ["1\n"], "outputs": ["1\n"]}),
    "math boxes": ("math", "\\boxed{" * (N // 7), "4"),
}
CONFIG = {
    "scorers": [
        {"name": "fmt", "kind": "regex", "options": {"pattern": r"\s*/?\s*(?:response|prompt)\b"}},
        {"name": "em", "kind": "exact_match"},
        {"name": "words", "kind": "length", "options": {"unit": "words"}},
        {"name": "code", "kind": "code", "options": {"concurrency": 1, "prefork": 1}},
        {"name": "math", "kind": "math", "options": {"workers": 1}},
    ]
}


def probe_during(url: str, body: dict) -> tuple[float, list[float], list[int]]:
    result: dict = {}

    def send() -> None:
        seconds, statuses = [], set()
        with httpx.Client(timeout=300) as c:
            for _ in range(ROUNDS):
                started = time.perf_counter()
                statuses.add(c.post(url + "/v1/score", json=body).status_code)
                seconds.append(time.perf_counter() - started)
        result["s"], result["status"] = statistics.median(seconds), sorted(statuses)

    thread = threading.Thread(target=send)
    latencies = []
    with httpx.Client(timeout=300) as client:
        thread.start()
        while thread.is_alive():
            t = time.perf_counter()
            client.get(url + "/health/live")
            latencies.append(time.perf_counter() - t)
            time.sleep(0.005)
    thread.join()
    return result["s"], latencies, result["status"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "service.yaml"
        cfg.write_text(json.dumps(CONFIG))
        with running_server(["--config", str(cfg)], Path(tmp), ready_timeout_s=300) as url:
            for kind, (scorer, response, reference) in CASES.items():
                item = {"id": "worst", "response": response, "reference": reference}
                seconds, lat, status = probe_during(url, {"scorers": [scorer], "items": [item]})
                lat_ms = sorted(x * 1000 for x in lat)
                p99 = lat_ms[min(len(lat_ms) - 1, int(0.99 * len(lat_ms)))]
                rows[kind] = {
                    "status": status,
                    "request_s_median": round(seconds, 3),
                    "probes": len(lat_ms),
                    "live_p50_ms": round(statistics.median(lat_ms), 1),
                    "live_p99_ms": round(p99, 1),
                    "live_max_ms": round(lat_ms[-1], 1),
                }
                print(kind, rows[kind], flush=True)
    out = {
        "rows": rows,
        "load_avg": os.getloadavg(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
