"""Where the audit's CPU goes, split by part, in process (docs/benchmarks/audit.md "Cost").

    python benchmarks/audit_cost.py --requests 3000 --rounds 3

The `--part cost` load of `benchmarks/overoptimization.py` (requests of 64 rules-proxy items in
groups of 8, a new policy version every 8 requests, `sample: 0.03`) offered straight to an
`AuditStream` whose auditor (`length`, words) is scored through the real in-process backend, so
the split leaves out only HTTP and the proxy's own scoring. Thread CPU time of each part, per
proxy item: the request path (`observe`: the sampler and the queue), the auditor's batches
through the backend (the loop thread's share of the whole, less the parts timed on it), the
text passes (signatures, lengths), the ledger (recording, bins, alarms), and one read of
everything (`GET /v1/audit`'s full body: every interval computed then). Rounds are fresh streams.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from overoptimization import VOCAB  # the benchmark's own words (benchmarks/ is on the path)
from rewardplane.serve.audit import stream as stream_module
from rewardplane.serve.audit.stream import AuditStream
from rewardplane.serve.backend import InProcessBackend
from rewardplane.serve.config import config_from_dict
from rewardplane.serve.scorers.base import ScoreItem

SCORERS = [
    {"name": "rm", "kind": "regex", "options": {"pattern": "(apple|cherry|mango)"}},
    {"name": "gold", "kind": "length", "options": {"unit": "words"}},
]
SPENT: collections.Counter[str] = collections.Counter()


def timed(owner: Any, name: str, label: str) -> None:
    """Add the thread CPU time of every call of `owner.name` to `SPENT[label]`."""
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return inner(*args, **kwargs)
        finally:
            SPENT[label] += time.thread_time() - started

    setattr(owner, name, wrapper)


def requests(n: int, seed: int = 0) -> list[tuple[list[ScoreItem], list[float]]]:
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(VOCAB) for _ in range(rng.randint(8, 40))) for _ in range(512)]
    return [
        ([ScoreItem(str(i), "Name a fruit.", texts[(i * 7 + s) % 512], group_id=f"{s}-{i // 8}",
                    metadata={"policy_version": s // 8}) for i in range(64)],
         [float(rng.random() < 0.3) for _ in range(64)])
        for s in range(n)
    ]  # fmt: skip


async def one_round(backend: Any, config: Any, load: list, secret: bytes) -> dict[str, float]:
    SPENT.clear()
    stream = AuditStream(config.audit, backend, secret=secret)
    await stream.start()
    loop_started, process_started = time.thread_time(), time.process_time()
    for k, (items, values) in enumerate(load):
        stream.observe(["rm"], items, {"rm": values})
        if k % 4 == 3:  # requests arrive over time, as through a server (4 concurrent)
            await asyncio.sleep(0.002)
    await stream.drain()
    loop = time.thread_time() - loop_started - SPENT["observe"]
    process = time.process_time() - process_started
    read_started = time.thread_time()
    body = stream._locked_snapshot(False, None)
    read = time.thread_time() - read_started
    await stream.stop()
    items = 64 * len(load)
    us = {label: 1e6 * s / items for label, s in SPENT.items()}
    us["auditor batches and the worker (loop thread)"] = 1e6 * loop / items
    us["process, all threads"] = 1e6 * process / items
    us["one full read, per proxy item"] = 1e6 * read / items
    us["audited"] = stream.counts.get("audited", 0)
    us["versions"] = len(body["versions"])
    return us


async def run(args: argparse.Namespace) -> list[dict[str, float]]:
    config = config_from_dict(
        {"scorers": SCORERS, "audit": {"proxy": "rm", "auditors": ["gold"], "sample": 0.03, "min_items": 100}}
    )
    backend = InProcessBackend(config)
    await backend.start()
    load = requests(args.requests)
    rounds = [await one_round(backend, config, load, bytes([r]) * 32) for r in range(args.rounds)]
    await backend.stop()
    return rounds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None, help="write the per-round split as JSON here")
    args = p.parse_args(argv)
    timed(AuditStream, "observe", "observe")
    timed(stream_module, "_text_passes", "text passes (thread)")
    timed(AuditStream, "_record", "ledger (thread)")
    load_before = os.getloadavg()
    rounds = asyncio.run(run(args))
    result = {"load_average_before": load_before, "load_average_after": os.getloadavg(),
              "requests": args.requests, "rounds": rounds}  # fmt: skip
    for label in rounds[0]:
        print(f"{label:48s} " + "  ".join(f"{r[label]:8.3f}" for r in rounds))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
