"""MBPP assert-style items/s and sandbox start-up, two source trees side by side
(docs/benchmarks/verifiers.md, "Issue 43").

    git worktree add /tmp/base82488e0 82488e0
    PYTHONPATH=src python benchmarks/verifiers_mbpp.py --base /tmp/base82488e0 --rounds 6 \\
        --out docs/benchmarks/verifiers_mbpp_issue43.json

Each round runs one child process per tree (PYTHONPATH=<tree>/src, the order alternating from
round to round), so before and after see the same load. A child:

1. start-up: `--startups` trivial stdin jobs (`print(time.time())`) through `LocalSandbox.run()`,
   one at a time with 2 ms between them; start-up = the program's first statement minus the call
   (one wall clock), p50;
2. items/s: the first `--items` MBPP problems of ../shared/data (the reference solution and its
   three asserts, `test_setup_code` included) through `CodeScorer.score_batch` in batches of 32
   with `concurrency` = the cores; one warm-up batch, then `--passes` passes, the median.

It also reports CPU per item (this process and, once the scorer is closed, the zygote and every
unit it reaped: the whole sandbox), which a loaded shared machine disturbs less than wall-clock
rates. The ratio is after ÷ before per round; the goal (issue 43) is a median ≥ 0.8 with start-up p50
≤ 5 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MBPP = REPO / ".." / "shared" / "data" / "mbpp_prompt_validation_train.jsonl"


def mbpp_items(n: int) -> list[tuple[str, dict]]:
    rows = [json.loads(line) for line in MBPP.open()][:n]
    out = []
    for row in rows:
        tests = "\n".join(row["test_list"]) + "\n"
        if row["test_setup_code"]:
            tests = row["test_setup_code"] + "\n" + tests
        out.append((row["code"], {"tests": tests}))
    return out


def child(args: argparse.Namespace) -> dict:
    """One tree's measurement (run with that tree's src first on PYTHONPATH)."""
    from rewardplane.serve.execution.sandbox import LocalSandbox
    from rewardplane.serve.protocol import ScoreItem
    from rewardplane.serve.scorers.code import CodeScorer

    box = LocalSandbox(prefork=2, timeout_s=5)
    box.start()
    starts = []
    for _ in range(args.startups):
        t0 = time.time()
        r = box.run({"mode": "stdin", "code": "import time\nprint(time.time())", "stdin": ""})
        starts.append((float(r.stdout) - t0) * 1000)
        time.sleep(0.002)
    box.close()
    cores = len(os.sched_getaffinity(0))
    scorer = CodeScorer("code", options={"concurrency": cores, "timeout_s": 10})
    scorer.load()
    items = [
        ScoreItem(id=str(i), prompt="", response=c, reference=ref)
        for i, (c, ref) in enumerate(mbpp_items(args.items))
    ]
    scorer.score_batch(items[:32])
    rates, passed = [], 0
    cpu0 = _cpu()
    for _ in range(args.passes):
        t0 = time.perf_counter()
        scores = []
        for k in range(0, len(items), 32):
            scores += scorer.score_batch(items[k : k + 32])
        rates.append(len(items) / (time.perf_counter() - t0))
        passed = sum(s == 1.0 for s in scores)
    scorer.close()  # waits for the zygote, which reaped every unit: their CPU is in RUSAGE_CHILDREN
    cpu_ms = (_cpu() - cpu0) * 1000 / (len(items) * args.passes)
    return {
        "cpu_ms_per_item": cpu_ms,
        "startup_p50_ms": statistics.median(starts),
        "items_per_s": statistics.median(rates),
        "items_per_s_passes": rates,
        "items": len(items),
        "scored_1": passed,
        "load_1m": os.getloadavg()[0],
    }


def _cpu() -> float:
    import resource

    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def run_tree(tree: Path, args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    cmd = [sys.executable, __file__, "--child", "--items", str(args.items), "--passes", str(args.passes)]
    cmd += ["--startups", str(args.startups)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=tree)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _git(tree: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", type=Path, help="the tree measured as 'before'")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--items", type=int, default=160)
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--startups", type=int, default=200)
    p.add_argument("--out", type=Path)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return
    if args.base is None:
        p.error("--base is required")
    trees = {"before": args.base.resolve(), "after": REPO}
    rounds = []
    for k in range(args.rounds):
        order = ["before", "after"] if k % 2 == 0 else ["after", "before"]
        got = {name: run_tree(trees[name], args) for name in order}
        got["ratio"] = got["after"]["items_per_s"] / got["before"]["items_per_s"]
        got["cpu_ratio"] = got["before"]["cpu_ms_per_item"] / got["after"]["cpu_ms_per_item"]
        rounds.append(got)
        print(
            f"round {k + 1}: items/s {got['before']['items_per_s']:.1f} -> {got['after']['items_per_s']:.1f}"
            f" (x{got['ratio']:.3f}; CPU/item x{got['cpu_ratio']:.3f} of before's speed), start-up p50 {got['before']['startup_p50_ms']:.2f} -> "
            f"{got['after']['startup_p50_ms']:.2f} ms, load {got['after']['load_1m']:.1f}",
            flush=True,
        )
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cores": os.cpu_count(),
        },
        "trees": {name: {"path": str(t), "commit": _git(t)} for name, t in trees.items()},
        "rounds": rounds,
        "median_ratio": statistics.median(r["ratio"] for r in rounds),
        "median_cpu_ratio": statistics.median(r["cpu_ratio"] for r in rounds),
        "pooled_ratio": sum(r["after"]["items_per_s"] for r in rounds)
        / sum(r["before"]["items_per_s"] for r in rounds),
        "startup_p50_ms_after_median": statistics.median(r["after"]["startup_p50_ms"] for r in rounds),
        "startup_p50_ms_before_median": statistics.median(r["before"]["startup_p50_ms"] for r in rounds),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
