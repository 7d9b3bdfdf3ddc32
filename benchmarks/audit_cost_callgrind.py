"""The audit's cost for a rules proxy counted in instructions, not seconds: each server of a
pair run under valgrind's callgrind (docs/benchmarks/audit.md "Cost").

    python benchmarks/audit_cost_callgrind.py --requests 600 --out DIR

On a shared VM a server's throughput moves by a fifth from one window to the next, and a
pair's CPU-per-item ratio by several points, so the HTTP harness (`overoptimization.py --part
cost`) cannot resolve a change of a point or two. Callgrind counts what the server's threads
execute, whatever else the machine runs. Each server (audit off, audit on at `--sample`) takes
`--warmup` requests uncounted (and, audited, more until the epoch's boost has ended: the
steady rate is what is measured); then counting starts, the same `--requests` requests are
sent (the HTTP harness's bodies: 64 items in groups of 8, a version every 8 requests), the
audit queue is drained, and counting stops. Reported per proxy item: instructions (Ir) and an
estimated cycle count from callgrind's simulated caches (Ir + 10 per first-level miss + 100 per
last-level miss: a rough weighting, not this CPU's). Under valgrind the threads run one at a
time and about 50 times slower, so timing-driven behaviour (how many requests the event loop
takes per wake-up, how full an audit batch is) differs from a native run; the counts say what
the code executes, not what a CPU does with it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from audit_http_cost import Bodies, load, same_layout, server_process, service_yaml, settle
from overoptimization import VOCAB  # the benchmark's own words (benchmarks/ is on the path)


def estimated_cycles(totals: dict[str, int]) -> int:
    first = totals["I1mr"] + totals["D1mr"] + totals["D1mw"]
    last = totals["ILmr"] + totals["DLmr"] + totals["DLmw"]
    return totals["Ir"] + 10 * first + 100 * last


def read_totals(path: Path) -> dict[str, int]:
    """The `totals:` line of a callgrind dump, by event name."""
    events: list[str] = []
    for line in path.read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("totals:"):
            return dict(zip(events, (int(x) for x in line.split()[1:]), strict=True))
    raise ValueError(f"{path}: no totals line")


def counted(url: str, requests: int, args: argparse.Namespace, bodies: Bodies, sent: int) -> int:
    """`requests` more requests, closed loop: the requests sent so far."""
    return asyncio.run(load(url, math.inf, args.concurrency, bodies, sent, count=requests))[2]


def one_server(mode: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Counted events per proxy item of one server (`mode` off or on)."""
    from rewardplane.bench.server import running_server

    work.mkdir(parents=True)
    config = work / f"service_{mode}.yaml"
    config.write_text(service_yaml(mode == "on", args.sample, "rules"))
    out = work / f"callgrind.{mode}"
    command, env = same_layout()
    valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--cache-sim=yes",
                f"--callgrind-out-file={out}"]  # fmt: skip
    bodies = Bodies(VOCAB, 64)
    python = command.index("{python}")  # valgrind runs the interpreter itself, inside setarch -R
    argv = [*command[:python], *valgrind, *command[python:], "--config", str(config), "--port", "{port}"]
    before: dict[str, int] = {}
    after: dict[str, int] = {}
    with running_server(
        [], work, command=argv, env=env, label=f"callgrind {mode}", log_name=f"{mode}.log"
    ) as url:
        pid = str(server_process(url).pid)
        sent = counted(url, args.warmup, args, bodies, 0)
        if mode == "on":
            while settle(url, timeout_s=600).get("sample_rate") != args.sample:  # the boost
                sent = counted(url, 50, args, bodies, sent)
            before = settle(url, timeout_s=600)["counts"]
        subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
        counted(url, args.requests, args, bodies, sent)
        if mode == "on":
            after = settle(url, timeout_s=600)["counts"]
        subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
        subprocess.run(["callgrind_control", "-i", "off", pid], check=True, capture_output=True)
    totals = read_totals(next(p for p in work.glob(f"callgrind.{mode}*") if p.name.endswith(".1")))
    items = 64 * args.requests
    return {
        "per_item": {k: round(v / items, 1) for k, v in totals.items()},
        "estimated_cycles_per_item": round(estimated_cycles(totals) / items, 1),
        "audited": after.get("audited", 0) - before.get("audited", 0),
        "items": items,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=600, help="counted requests per server (64 items each)")
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--sample", type=float, default=0.03)
    p.add_argument("--out", required=True, help="a new directory: the servers' logs, dumps and result.json")
    args = p.parse_args(argv)
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            print(f"error: {tool} is not installed (apt install valgrind)", file=sys.stderr)
            return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=False)
    with ThreadPoolExecutor(2) as pool:  # both servers at once, one a core
        futures = {m: pool.submit(one_server, m, args, out / m) for m in ("off", "on")}
        runs = {m: f.result() for m, f in futures.items()}
    off, on = runs["off"], runs["on"]
    result = {
        "instructions_ratio": round(on["per_item"]["Ir"] / off["per_item"]["Ir"], 4),
        "estimated_cycles_ratio": round(
            on["estimated_cycles_per_item"] / off["estimated_cycles_per_item"], 4
        ),
        "audited_share": round(on["audited"] / on["items"], 4),
        # the secret is random at each start, so a run audits a little more or less than `sample`:
        # the extra instructions scaled to exactly `sample` of the items (none when none was audited)
        "instructions_ratio_at_sample": round(
            1
            + (on["per_item"]["Ir"] / off["per_item"]["Ir"] - 1) * args.sample * on["items"] / on["audited"],
            4,
        )
        if on["audited"]
        else None,
        "servers": runs,
        "settings": vars(args),
        "machine": platform.platform(),
        "python": platform.python_version(),
        "valgrind": subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout.strip(),
    }
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    print(
        json.dumps(
            {
                k: result[k]
                for k in (
                    "instructions_ratio",
                    "instructions_ratio_at_sample",
                    "estimated_cycles_ratio",
                    "audited_share",
                )
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
