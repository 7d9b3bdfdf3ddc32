"""benchmarks/verifiers.py's code sections: sandbox start-up and round trip with their process
references, and assert-style items through `CodeScorer`."""

from __future__ import annotations

import concurrent.futures
import os
import random
import statistics
import subprocess
import sys
import time

from verifiers_common import pct


def bench_sandbox(isolation: str, n: int, concurrency: int) -> dict:
    from rewardplane.serve.execution.sandbox import LocalSandbox

    box = LocalSandbox(isolation=isolation, timeout_s=5, prefork=max(2, concurrency))
    box.start()
    try:
        code = "import time\nprint(time.time())"
        for _ in range(20):
            box.run({"mode": "stdin", "code": code, "stdin": ""})
        start, rtt = [], []
        for _ in range(n):
            t = time.time()
            r = box.run({"mode": "stdin", "code": code, "stdin": ""})
            assert r.status == "ok", r
            start.append((float(r.stdout) - t) * 1e3)
            rtt.append(r.wall_s * 1e3)
            time.sleep(0.002)  # let the zygote refill its pre-forked runners, as between batches
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda _: box.run({"mode": "stdin", "code": "pass", "stdin": ""}), range(n)))
        wall = time.perf_counter() - t0
        return {
            "isolation": isolation,
            "process_limit": box.process_limit(),
            "startup_p50_ms": statistics.median(start),
            "startup_p99_ms": pct(start, 99),
            "round_trip_p50_ms": statistics.median(rtt),
            "round_trip_p99_ms": pct(rtt, 99),
            "runs_per_s": n / wall,
            "concurrency": concurrency,
        }
    finally:
        box.close()


def code_assert_items(n: int, seed: int = 0) -> list[tuple[str, dict]]:
    """(response, reference): MBPP-shaped assert-style items, a 6-line function and 5 asserts
    with literal expected values, half right (the other half wrong on every case but one)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        k = rng.randint(2, 9)
        wrong = i % 2
        body = (
            "```python\n"
            "def f(xs):\n"
            "    total = 0\n"
            "    for x in xs:\n"
            f"        if x % {k} {'!=' if wrong else '=='} 0:\n"
            "            total += x\n"
            "    return total\n"
            "```"
        )
        cases = []
        for _ in range(5):
            xs = [rng.randint(0, 99) for _ in range(rng.randint(3, 12))]
            want = sum(x for x in xs if x % k == 0)
            cases.append(f"assert f({xs}) == {want}")
        out.append((body, {"tests": "\n".join(cases) + "\n"}))
    return out


def bench_code_assert(n: int, concurrency: int, repeats: int = 3, batch: int = 32) -> dict:
    """Assert-style items/s through `CodeScorer.score_batch` (local backend, the isolation in
    force), batches of `batch` from one caller, `concurrency` items run at once; best and median
    of `repeats` passes over the same `n` items."""
    from rewardplane.serve.protocol import ScoreItem
    from rewardplane.serve.scorers.code import CodeScorer

    data = code_assert_items(n)
    items = [ScoreItem(id=str(i), prompt="", response=r, reference=ref) for i, (r, ref) in enumerate(data)]
    scorer = CodeScorer("code", options={"timeout_s": 5, "concurrency": concurrency})
    scorer.load()
    try:
        scorer.score_batch(items[:batch])  # warm
        rates, scores = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            scores = []
            for s in range(0, n, batch):
                scores += scorer.score_batch(items[s : s + batch])
            rates.append(n / (time.perf_counter() - t0))
        assert all(isinstance(x, float) for x in scores), [x for x in scores if not isinstance(x, float)][:3]
        return {
            "isolation": scorer.options.isolation,
            "items": n,
            "concurrency": concurrency,
            "items_per_s_median": statistics.median(rates),
            "items_per_s_best": max(rates),
            "items_per_s_all": rates,
            "mean_score": statistics.mean(scores),
        }
    finally:
        scorer.close()


def bench_process_refs(n: int = 30) -> dict:
    def timeit(cmd):
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            subprocess.run(cmd, check=True)
            ts.append((time.perf_counter() - t) * 1e3)
        return statistics.median(ts)

    forks = []
    for _ in range(n * 10):
        t = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        forks.append((time.perf_counter() - t) * 1e3)
    return {
        "python_I_c_pass_ms": timeit([sys.executable, "-I", "-c", "pass"]),
        "python_S_c_pass_ms": timeit([sys.executable, "-S", "-c", "pass"]),
        "fork_wait_from_this_process_ms": statistics.median(forks),
        "unshare_rn_true_ms": timeit(["unshare", "-rn", "true"]),
        "true_ms": timeit(["true"]),
    }
