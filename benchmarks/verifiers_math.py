"""benchmarks/verifiers.py's math sections (1-3 of its docstring): in-thread reference, independent
processes, the worker pool alone, and `POST /v1/score`."""

from __future__ import annotations

import concurrent.futures
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from verifiers_common import WORDS, children, cpu_s, pct, served


def answers(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """(response, reference): ~300 words of reasoning ending in a boxed answer, half right."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            ref, right, wrong = f"{rng.randint(2, 999)}", None, None
            right, wrong = ref, str(int(ref) + rng.randint(1, 9))
        elif kind == 1:
            p, q = rng.randint(1, 9), rng.randint(10, 19)
            ref, right, wrong = (
                f"\\frac{{{p}}}{{{q}}}",
                f"\\frac{{{2 * p}}}{{{2 * q}}}",
                f"\\frac{{{q}}}{{{p}}}",
            )
        elif kind == 2:
            a = rng.randint(2, 9)
            ref, right, wrong = f"{a}\\sqrt{{2}}", f"\\sqrt{{{2 * a * a}}}", f"{a}\\sqrt{{3}}"
        else:
            a = rng.randint(1, 5)
            ref, right, wrong = f"x^2 + {2 * a}x + {a * a}", f"(x+{a})^2", f"(x+{a + 1})^2"
        body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(250, 350)))
        answer = right if i % 2 == 0 else wrong
        out.append((f"{body}. So the final answer is $\\boxed{{{answer}}}$.", ref))
    return out


def bench_math_in_thread(data: list[tuple[str, str]]) -> dict:
    import logging

    from rewardplane.serve.scorers.math import WARMUP, check_answer

    logging.disable(logging.CRITICAL)  # as in the pool's workers
    for r, ref in WARMUP:  # the warm-up every pool worker runs before it says ready
        check_answer(r, ref, {})
    lat = []
    t0, c0 = time.perf_counter(), time.process_time()
    right = 0
    for r, ref in data:
        t = time.perf_counter()
        res = check_answer(r, ref, {})
        lat.append((time.perf_counter() - t) * 1e3)
        right += res == ("ok", 1.0)
    wall, used = time.perf_counter() - t0, time.process_time() - c0
    logging.disable(logging.NOTSET)
    return {
        "items": len(data),
        "items_per_s": len(data) / wall,
        "cpu_us_per_item": used / len(data) * 1e6,
        "p50_ms": statistics.median(lat),
        "p99_ms": pct(lat, 99),
        "right_fraction": right / len(data),
    }


_PARALLEL_CHILD = """
import json, logging, sys, time
from rewardplane.serve.scorers.math import WARMUP, check_answer
logging.disable(logging.CRITICAL)
data = json.loads(sys.stdin.readline())
for r, ref in WARMUP:
    check_answer(r, ref, {})
print("ready", flush=True)
sys.stdin.readline()
t0 = time.perf_counter()
for r, ref in data:
    check_answer(r, ref, {})
print(time.perf_counter() - t0, flush=True)
"""


def bench_math_parallel(data: list[tuple[str, str]], procs: int) -> dict:
    """The hardware's own ceiling: `procs` independent processes, each verifying its share in a
    loop, no IPC, started together. Where cores share a physical core (SMT) or memory bandwidth,
    this is below procs x the single-core rate.

    Shares are dealt from a seeded shuffle: the items cycle through answer kinds (`i % 4`) and
    right/wrong (`i % 2`), so `data[k::procs]` would give each process one kind only, and the
    run's time would be that of the processes holding the slowest kind (wrong polynomials)."""
    mixed = random.Random(0).sample(data, len(data))
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _PARALLEL_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(procs)
    ]
    for k, child in enumerate(children):
        child.stdin.write(json.dumps(mixed[k::procs]) + "\n")
        child.stdin.flush()
    for child in children:
        assert child.stdout.readline().strip() == "ready"
    t0 = time.perf_counter()
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    took = [float(child.stdout.readline()) for child in children]
    wall = time.perf_counter() - t0
    for child in children:
        child.stdin.close()
        child.wait()
    return {"processes": procs, "items": len(data), "items_per_s": len(data) / wall, "slowest_s": max(took)}


def bench_math_pool(data: list[tuple[str, str]], workers: int, clients: int, batch: int = 32) -> dict:
    """The worker pool alone, as the batcher drives it (several batches at once), no HTTP."""
    import resource

    from rewardplane.serve.protocol import ScoreItem
    from rewardplane.serve.scorers.math import MathScorer

    scorer = MathScorer("math", options={"workers": workers, "spares": 1, "timeout_s": 5.0})
    scorer.load()
    try:
        items = [
            ScoreItem(id=str(i), prompt="", response=r, reference=ref) for i, (r, ref) in enumerate(data)
        ]
        batches = [items[i : i + batch] for i in range(0, len(items), batch)]

        def cpu() -> float:
            r = resource.getrusage(resource.RUSAGE_SELF)
            return r.ru_utime + r.ru_stime

        t0, c0 = time.perf_counter(), cpu()
        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            out = [x for b in pool.map(scorer.score_batch, batches) for x in b]
        wall, used = time.perf_counter() - t0, cpu() - c0
        assert all(isinstance(x, float) for x in out), [x for x in out if not isinstance(x, float)][:3]
        return {
            "items": len(items),
            "workers": workers,
            "batch": batch,
            "threads": clients,
            "items_per_s": len(items) / wall,
            "parent_cpu_us_per_item": used / len(items) * 1e6,
        }
    finally:
        scorer.close()


def bench_math_http(data: list[tuple[str, str]], workers: int | None, clients: int, batch: int = 32) -> dict:
    options: dict = {"spares": 1, "timeout_s": 5.0}
    if workers:
        options["workers"] = workers
    cfg = {
        "scorers": [
            {"name": "math", "kind": "math", "max_batch_size": 64, "max_wait_ms": 1, "options": options}
        ]
    }
    with served(cfg) as url:
        servers = [p for p in children(os.getpid()) if b"serve" in Path(f"/proc/{p}/cmdline").read_bytes()]
        server = servers[0] if len(servers) == 1 else None
        items = [{"id": str(i), "response": r, "reference": ref} for i, (r, ref) in enumerate(data)]
        client = httpx.Client(timeout=120, limits=httpx.Limits(max_connections=max(16, clients)))
        headers = {"content-type": "application/json"}

        def post(body: bytes) -> float:
            t = time.perf_counter()
            r = client.post(url + "/v1/score", content=body, headers=headers)
            r.raise_for_status()
            res = r.json()["results"]
            assert all("math" in x["scores"] for x in res), [x["errors"] for x in res if x["errors"]][:3]
            return (time.perf_counter() - t) * 1e3

        def body(chunk: list[dict]) -> bytes:
            return json.dumps({"scorers": ["math"], "items": chunk}).encode()

        post(body(items[: 4 * batch]))  # warm the connection pool and the server's code paths
        bodies = [body(items[i : i + batch]) for i in range(0, len(items), batch)]  # off the clock
        workers_pids = children(server) if server else []
        s0, w0 = (cpu_s(server) if server else 0.0), sum(map(cpu_s, workers_pids))
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            list(pool.map(post, bodies))
        wall = time.perf_counter() - t0
        s1, w1 = (cpu_s(server) if server else 0.0), sum(map(cpu_s, workers_pids))
        info = next(s for s in client.get(url + "/v1/scorers").json()["scorers"] if s["name"] == "math")
        lat = [post(body([it])) for it in items[:400]]
        return {
            "items": len(items),
            "batch": batch,
            "clients": clients,
            "workers": info["extra"]["limits"]["workers"],
            "depth": info["extra"]["limits"].get("depth"),
            "items_per_s": len(items) / wall,
            "server_cpu_us_per_item": (s1 - s0) / len(items) * 1e6 if server else None,
            "workers_cpu_us_per_item": (w1 - w0) / len(items) * 1e6 if server else None,
            "latency_batch1_items": len(lat),
            "latency_batch1_p50_ms": statistics.median(lat),
            "latency_batch1_p99_ms": pct(lat, 99),
        }
