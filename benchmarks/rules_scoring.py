"""What a text rule costs through the batcher: process CPU per item, in process (no HTTP).

    python benchmarks/rules_scoring.py --trees src OTHER/src --rounds 4

Each round runs, for every source tree in turn (a fresh process each, `PYTHONPATH` set to the
tree), `--requests` requests of `--batch` items (the `overoptimization.py --part cost` texts)
through a `regex` and a `length` scorer's `DynamicBatcher`, one request at a time. Rounds
interleave the trees, so a machine that slows down slows every tree alike. Results:
docs/benchmarks/audit.md ("Cost").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

SCORERS = [
    {"name": "regex", "kind": "regex", "options": {"pattern": "(apple|cherry|mango)"}},
    {"name": "length", "kind": "length", "options": {"unit": "words"}},
]
WORDS = [
    "apple",
    "pear",
    "plum",
    "kiwi",
    "lemon",
    "mango",
    "cherry",
    "hammer",
    "saw",
    "drill",
    "red",
    "blue",
    "green",
]


async def child(requests: int, batch: int) -> dict[str, float]:
    from rewardplane.serve.backend import InProcessBackend
    from rewardplane.serve.config import config_from_dict
    from rewardplane.serve.scorers.base import ScoreItem

    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40))) for _ in range(512)]
    backend = InProcessBackend(config_from_dict({"scorers": SCORERS}))
    await backend.start()
    out = {}
    for name in ("regex", "length"):
        load = [
            [ScoreItem(str(i), "p", texts[(i * 7 + k) % 512]) for i in range(batch)] for k in range(requests)
        ]
        started, wall = time.process_time(), time.perf_counter()
        for items in load:
            await backend.score(name, items)
        out[f"{name}_cpu_us_per_item"] = 1e6 * (time.process_time() - started) / (requests * batch)
        out[f"{name}_wall_us_per_item"] = 1e6 * (time.perf_counter() - wall) / (requests * batch)
    await backend.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trees", nargs="+", default=["src"], help="source trees (PYTHONPATH) to compare")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--out", default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(asyncio.run(child(args.requests, args.batch))))
        return 0
    runs: dict[str, list[dict[str, float]]] = {tree: [] for tree in args.trees}
    for r in range(args.rounds):
        for tree in args.trees if r % 2 == 0 else reversed(args.trees):
            env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
            cmd = [
                sys.executable,
                __file__,
                "--child",
                "--requests",
                str(args.requests),
                "--batch",
                str(args.batch),
            ]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            runs[tree].append(json.loads(done.stdout.strip().splitlines()[-1]))
    medians = {
        tree: {k: round(statistics.median(r[k] for r in rs), 2) for k in rs[0]} for tree, rs in runs.items()
    }
    for tree, row in medians.items():
        print(tree, row)
    if args.out:
        body = {"command": " ".join(["python", "benchmarks/rules_scoring.py", *(argv or sys.argv[1:])]),
                "load_average": os.getloadavg(), "medians": medians, "runs": runs}  # fmt: skip
        Path(args.out).write_text(json.dumps(body, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
