"""What the audit costs a proxy through HTTP: `benchmarks/overoptimization.py --part cost`.

Two `rewardplane serve` processes with the same scorers, the audit on in one (`--sample`) and off
in the other, loaded in alternating windows by one closed-loop client; `--cost-pairs` fresh
pairs (which server starts first alternates), because two processes of one server differ by
several percent on their own, and `--cost-control` (the audit off in both) measures that floor.

What is measured, and why so:
- **Server CPU per proxy item**: each server's process CPU over the whole measured stretch (every
  window of both, then one wait until the audit queue is empty), over the items it scored. The
  audited server's backlog is audited whenever it runs, during the other server's window too,
  and it is all counted; nothing polls the audit between windows (a poll is a request, and
  dozens a window would add the harness's own reads to the cost).
- **Items/s**: within each window. The servers are pinned to one CPU and the client to the
  others (`--cost-pin`, on with two CPUs or more), so the client never competes with the server
  it loads, and a server's extra CPU is lost throughput; the client sends pre-encoded bodies and
  reads only the status, so that the server, not the client, is what bounds the rate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import shutil
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SETTLE_POLLS: list[int] = [0]
"""`GET /v1/audit` calls made while settling (their server CPU is counted in the `on` server's)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cost-windows", type=int, default=24, help="alternating load windows per mode")
    p.add_argument(
        "--cost-proxy", choices=("rm", "rules"), default="rm", help="tiny text RMs, or a rules proxy"
    )
    p.add_argument(
        "--cost-pairs", type=int, default=1, help="fresh pairs of servers, each run --cost-windows"
    )
    p.add_argument("--cost-control", action="store_true", help="A/A: the audit off in both servers")
    p.add_argument("--cost-seconds", type=float, default=4.0)
    p.add_argument("--cost-concurrency", type=int, default=4)
    p.add_argument("--cost-batch", type=int, default=64)
    p.add_argument(
        "--cost-audit",
        default="",
        help="more settings of the audited server's audit section, e.g. 'batch_size: 256'",
    )
    p.add_argument(
        "--cost-pin",
        choices=("auto", "on", "off"),
        default="auto",
        help="servers on CPU 0, the client on the rest (auto: with 2 CPUs or more)",
    )


def service_yaml(audit: bool, sample: float, proxy: str = "rm", extra: str = "") -> str:
    """Two tiny text RMs (`proxy` rm), or a rules proxy (a regex) audited by a rule (word count):
    there the audit's own machinery, not an auditor model, is what it costs."""
    scorers = (
        "scorers:\n"
        "  - {name: rm, kind: hf_seqcls, shape: tiny-text-rm, device: cpu, max_batch_size: 64, max_wait_ms: 2}\n"
        "  - {name: gold, kind: hf_seqcls, shape: tiny-text-rm, device: cpu, max_batch_size: 64, max_wait_ms: 2}\n"
    )
    if proxy == "rules":
        scorers = (
            "scorers:\n"
            "  - {name: rm, kind: regex, options: {pattern: '(apple|cherry|mango)'}}\n"
            "  - {name: gold, kind: length, options: {unit: words}}\n"
        )
    return scorers + (
        f"audit: {{proxy: rm, auditors: [gold], sample: {sample}, min_items: 100{', ' + extra if extra else ''}}}\n"
        if audit
        else ""
    )


class Bodies:
    """`POST /v1/score` bodies (scorer rm), pre-encoded: the k-th request's items rotate over the
    texts, groups of 8 with ids unique to the request, a new policy version every 8 requests."""

    def __init__(self, vocab: list[str], batch: int, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.texts = [
            json.dumps(" ".join(rng.choice(vocab) for _ in range(rng.randint(8, 40)))) for _ in range(512)
        ]
        self.batch = batch

    def body(self, k: int) -> bytes:
        items = ",".join(
            f'{{"id":"{i}","prompt":"Name a fruit.","response":{self.texts[(i * 7 + k) % 512]},'
            f'"group_id":"{k}-{i // 8}","metadata":{{"policy_version":{k // 8}}}}}'
            for i in range(self.batch)
        )
        return f'{{"scorers":["rm"],"items":[{items}]}}'.encode()


async def load(
    url: str, seconds: float, concurrency: int, bodies: Bodies, start: int, count: int | None = None
) -> tuple[int, float, int]:
    """Closed-loop load for `seconds`, or until `count` requests are sent: (items, elapsed,
    requests sent so far)."""
    import httpx

    done = 0
    sent = start
    stop = math.inf if count is None else start + count

    async def worker(client: httpx.AsyncClient, deadline: float) -> None:
        nonlocal done, sent
        while time.perf_counter() < deadline and sent < stop:
            body = bodies.body(sent)
            sent += 1
            response = await client.post(
                f"{url}/v1/score", content=body, headers={"content-type": "application/json"}
            )
            response.raise_for_status()
            done += bodies.batch

    async with httpx.AsyncClient(timeout=120) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client, started + seconds) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return done, elapsed, sent


def settle(url: str, timeout_s: float = 60, poll_s: float = 0.25) -> dict[str, Any]:
    """Wait until the audit queue is empty; the audit's counters. A partly filled audit batch
    waits up to `batch_wait_s` (2 s): polled every `poll_s`, a few polls a settle."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        SETTLE_POLLS[0] += 1
        body = httpx.get(f"{url}/v1/audit", params={"summary": "true"}, timeout=30).json()
        if body["queue_depth"] == 0 or time.monotonic() > deadline:
            return body
        time.sleep(poll_s)


def server_process(url: str) -> Any:
    """The process listening on `url`'s port (its CPU time is what the audit could add to)."""
    import psutil

    port = int(url.rsplit(":", 1)[1])
    for conn in psutil.net_connections(kind="tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
            return psutil.Process(conn.pid)
    raise RuntimeError(f"no process listens on port {port}")


def same_layout() -> tuple[list[str], dict[str, str]]:
    """Both servers of a pair laid out alike: one hash seed, and address-space randomisation
    off where `setarch -R` exists (two processes of one server otherwise differ by several
    percent of CPU per item, by where their objects and dicts happen to fall)."""
    command = ["{python}", "-m", "rewardplane", "serve"]
    if shutil.which("setarch"):
        command = ["setarch", platform.machine(), "-R", *command]
    return command, {"PYTHONHASHSEED": "0"}


def _thread_cpu(proc: Any) -> dict[int, float]:
    """CPU seconds of each of `proc`'s threads so far."""
    return {t.id: t.user_time + t.system_time for t in proc.threads()}


def _split(pid: int, before: dict[int, float], after: dict[int, float], items: int) -> dict[str, float]:
    """Server CPU µs per item over the stretch: the event loop's thread (the main one) and the
    others together (scoring threads, the audit's recording thread), to tell the audit's own
    work from what it does to the loop."""
    spent = {tid: cpu - before.get(tid, 0.0) for tid, cpu in after.items()}
    loop = spent.pop(pid, 0.0)
    return {"loop": round(1e6 * loop / items, 2), "other": round(1e6 * sum(spent.values()) / items, 2)}


def _pin_threads(proc: Any, cpus: set[int]) -> None:
    """Every thread of `proc` on `cpus` (a thread started later inherits its starter's)."""
    for thread in proc.threads():
        with contextlib.suppress(OSError):
            os.sched_setaffinity(thread.id, cpus)


@contextlib.contextmanager
def _client_on(cpus: set[int] | None) -> Iterator[None]:
    """This process (the client) on `cpus` for the stretch, then back where it was."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _pinning(args: argparse.Namespace) -> tuple[set[int], set[int]] | None:
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if args.cost_pin == "off" or len(cpus) < 2:
        if args.cost_pin == "on":
            raise SystemExit("--cost-pin on needs 2 CPUs or more")
        return None
    return {cpus[0]}, set(cpus[1:])


def part_cost(args: argparse.Namespace, vocab: list[str]) -> dict[str, Any]:
    """Proxy items/s and server CPU per item, audit off and on, over `--cost-pairs` fresh pairs."""
    load_before = os.getloadavg()  # the machine is shared: what else ran is part of the result
    pins = _pinning(args)
    pairs = [_cost_pair(args, k, Bodies(vocab, args.cost_batch), pins) for k in range(args.cost_pairs)]
    items, seconds, cpu = (
        {m: sum(p[k][m] for p in pairs) for m in ("off", "on")} for k in ("items", "seconds", "cpu_s")
    )
    rate = {m: items[m] / seconds[m] for m in items}
    per_item = {m: 1e6 * cpu[m] / items[m] for m in items}
    ratios = [b / a for p in pairs for a, b in zip(p["windows"]["off"], p["windows"]["on"], strict=True)]
    sampled = sum(p["sampled_in_windows"] for p in pairs)  # not the warm-up's, nor the boost's
    return {
        "proxy": args.cost_proxy,
        "control": args.cost_control,
        "audit_settings": args.cost_audit,
        "pinned": None if pins is None else {"servers": sorted(pins[0]), "client": sorted(pins[1])},
        "server_command": same_layout()[0],
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "overhead_ratio": round(rate["on"] / rate["off"], 4),
        "items_per_s": {m: round(v, 1) for m, v in rate.items()},
        "window_ratio_median": round(statistics.median(ratios), 4),
        "server_cpu_us_per_item": {m: round(v, 1) for m, v in per_item.items()},
        "cpu_per_item_ratio": round(per_item["on"] / per_item["off"], 4),
        "pair_items_per_s_ratios": [p["items_per_s_ratio"] for p in pairs],
        "pair_cpu_per_item_ratios": [p["cpu_per_item_ratio"] for p in pairs],
        "pair_cpu_per_item_ratio_median": round(statistics.median(p["cpu_per_item_ratio"] for p in pairs), 4),
        "pair_thread_deltas_us": [
            {
                k: round(p["threads_us_per_item"]["on"][k] - p["threads_us_per_item"]["off"][k], 2)
                for k in ("loop", "other")
            }
            for p in pairs
        ],
        "pairs": pairs,
        "windows": args.cost_windows,
        "window_seconds": args.cost_seconds,
        "audit_counts": pairs[-1]["audit_counts"],
        "settle_polls": SETTLE_POLLS[0],
        "sampled_share": round(sampled / max(1, items["on"]), 4),
    }


def _cost_pair(
    args: argparse.Namespace, k: int, bodies: Bodies, pins: tuple[set[int], set[int]] | None
) -> dict[str, Any]:
    """One pair of fresh servers, `cost_windows` alternating windows each: items, seconds and
    server CPU seconds per mode."""
    from rewardplane.bench.server import running_server

    work = Path(args.workdir) / f"pair{k}"
    work.mkdir(parents=True, exist_ok=True)
    configs = {}
    for mode in ("off", "on"):
        configs[mode] = work / f"service_{mode}.yaml"
        audited = mode == "on" and not args.cost_control
        configs[mode].write_text(service_yaml(audited, args.sample, args.cost_proxy, args.cost_audit))
    items, seconds = {"off": 0, "on": 0}, {"off": 0.0, "on": 0.0}
    windows: dict[str, list[float]] = {"off": [], "on": []}
    sent = 0
    first, second = ("off", "on") if k % 2 == 0 else ("on", "off")  # which one starts first alternates
    command, env = same_layout()
    with (
        running_server([], work, command=[*command, "--config", str(configs[first]), "--port", "{port}"],
                       env=env, label=f"audit {first}", log_name=f"{first}.log") as a,
        running_server([], work, command=[*command, "--config", str(configs[second]), "--port", "{port}"],
                       env=env, label=f"audit {second}", log_name=f"{second}.log") as b,
        _client_on(None if pins is None else pins[1]),
    ):  # fmt: skip
        urls = {first: a, second: b}
        procs = {mode: server_process(url) for mode, url in urls.items()}
        quiet = args.cost_control
        for mode in ("off", "on"):  # warm-up, not counted: every thread the load starts is started
            sent = asyncio.run(load(urls[mode], 2.0, args.cost_concurrency, bodies, sent))[2]
        for _ in range(30):  # and the epoch's boost: the steady state at `sample` is what is measured
            if quiet or settle(urls["on"]).get("sample_rate") == args.sample:
                break
            sent = asyncio.run(load(urls["on"], 1.0, args.cost_concurrency, bodies, sent))[2]
        if pins is not None:
            for proc in procs.values():
                _pin_threads(proc, pins[0])
        before_windows = {} if quiet else settle(urls["on"])["counts"]
        before = {m: procs[m].cpu_times() for m in procs}
        threads_before = {m: _thread_cpu(procs[m]) for m in procs}
        for w in range(args.cost_windows):
            for mode in ("off", "on") if w % 2 == 0 else ("on", "off"):
                done, elapsed, sent = asyncio.run(
                    load(urls[mode], args.cost_seconds, args.cost_concurrency, bodies, sent)
                )
                items[mode] += done
                seconds[mode] += elapsed
                windows[mode].append(done / elapsed)
            print(f"  cost pair {k} window {w}: off {windows['off'][-1]:.0f} items/s, "
                  f"on {windows['on'][-1]:.0f} items/s", flush=True)  # fmt: skip
        audit = {"counts": {}} if quiet else settle(urls["on"])  # the backlog is this stretch's cost
        after = {m: procs[m].cpu_times() for m in procs}
        threads_after = {m: _thread_cpu(procs[m]) for m in procs}
    cpu = {m: (after[m].user - before[m].user) + (after[m].system - before[m].system) for m in procs}
    rate = {m: items[m] / seconds[m] for m in items}
    per_item = {m: cpu[m] / items[m] for m in items}
    threads = {m: _split(procs[m].pid, threads_before[m], threads_after[m], items[m]) for m in procs}
    return {
        "items": items,
        "threads_us_per_item": threads,
        "seconds": {m: round(v, 3) for m, v in seconds.items()},
        "cpu_s": {m: round(v, 3) for m, v in cpu.items()},
        "windows": {m: [round(x, 1) for x in v] for m, v in windows.items()},
        "items_per_s_ratio": round(rate["on"] / rate["off"], 4),
        "cpu_per_item_ratio": round(per_item["on"] / per_item["off"], 4),
        "audit_counts": audit["counts"],
        "sampled_in_windows": audit["counts"].get("sampled", 0) - before_windows.get("sampled", 0),
        "sample_rate_at_end": audit.get("sample_rate"),
    }
