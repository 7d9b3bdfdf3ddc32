"""Per-call overhead of each trainer route against `POST /v1/score`, for the same items.

One `rewardplane serve --config` process hosts a text reward model (`hf_seqcls`; `tiny-text-rm`
on CPU, a real shape with `--shape` on a GPU). Every route scores the same items, 64 per call,
from 16 concurrent callers (threads, closed loop, `--seconds` each after a warm-up):

  v1_score   `POST /v1/score` through rewardplane's own client (the reference)
  openrlhf   `POST /get_reward` with 64 queries, `mode=split` (prompt + response re-rendered)
  unirl      `POST /score`, protocol "1", 64 requests of one text turn pair each
  trl        `integrations.trl.RemoteReward(prompts, completions)` as GRPOTrainer calls it
  verl       `integrations.verl.compute_score_async(...)` for each item, gathered on one event loop
             per caller thread, as a verl 0.9 RewardLoopWorker fans a chunk out to its manager

Routes are interleaved over `--rounds` rounds (rotated order) and the median kept, so drift on
a shared machine hits every route alike. Reported per route: items/s and the ratio to `v1_score` (goal ≥ 0.95, docs/benchmarks/integrations.md).

    python3 benchmarks/integrations.py --out integrations.json

`--components` (issue 38 item 4) measures what reward components cost each adapter instead. The
server also hosts the composite `reward` (the hosted `rm` at weight 1 + the response length at
0.01), and each adapter's components route is compared with its scalar route for that
composite, call for call:

  trl    `RemoteReward(scorer="reward")` (the total) vs `RemoteRewards(composite="reward")`,
         both of its functions called per batch as GRPOTrainer calls them (one request)
  verl   `compute_score_async(..., components=False)` vs the default `{"score", <component>...}`,
         64 items gathered on one event loop

One caller sends `--pairs` pairs per round, the two routes alternating which goes first, so the
drift of a shared machine hits both alike; per round the ratio of the median call times
(components ÷ scalar), then their median over `--rounds` rounds and the spread (min–max). Goal:
at most 1.05.

    python3 benchmarks/integrations.py --components --rounds 5 --pairs 40 --out components.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml

from rewardplane.bench.server import running_server

PROMPTS = [f"Question {k}: explain step {k % 7} of the proof in plain words." for k in range(64)]
RESPONSES = [("The step holds because each term is bounded. " * (1 + k % 5)).strip() for k in range(64)]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--shape", default="tiny-text-rm")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--callers", type=int, default=16)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per route")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        help="client processes the callers are spread over (threads in each)",
    )
    p.add_argument("--routes", default="v1_score,openrlhf,unirl,trl,verl")
    p.add_argument("--rounds", type=int, default=3, help="routes interleaved this many times; median kept")
    p.add_argument("--components", action="store_true", help="scalar vs components route per adapter")
    p.add_argument("--pairs", type=int, default=40, help="--components: call pairs per round")
    return p.parse_args(argv)


COMPOSITE = {
    "name": "reward",
    "kind": "composite",
    "max_batch_size": 1024,
    "max_wait_ms": 2.0,
    "options": {
        "components": [
            {"name": "model", "scorer": "rm", "weight": 1.0},
            {"name": "length", "kind": "length", "weight": 0.01},
        ]
    },
}
"""`--components`: the composite whose scalar and components routes are compared."""


def component_calls(url: str, batch: int) -> dict[str, tuple]:
    """adapter -> (its scalar call, its components call) for the composite `reward`, each
    scoring `batch` items once and returning what the trainer would get."""
    from rewardplane.integrations.trl import RemoteReward, RemoteRewards
    from rewardplane.integrations.verl import compute_score_async

    prompts, responses = PROMPTS[:batch], RESPONSES[:batch]
    scalar, functions = RemoteReward(url, scorer="reward"), RemoteRewards(url, composite="reward")
    loop = asyncio.new_event_loop()

    def trl_components() -> list:
        return [f(prompts=prompts, completions=responses) for f in functions]

    def verl(components: bool):
        async def chunk() -> list:
            return await asyncio.gather(
                *(
                    compute_score_async(
                        "bench", r, None, {"prompt": p}, url=url, scorer="reward", components=components
                    )
                    for p, r in zip(prompts, responses, strict=True)
                )
            )

        return lambda: loop.run_until_complete(chunk())

    return {
        "trl": (lambda: scalar(prompts=prompts, completions=responses), trl_components),
        "verl": (verl(False), verl(True)),
    }


def paired(calls: tuple, pairs: int) -> tuple[float, float]:
    """(median call time of the scalar route, of the components route), over `pairs` pairs
    called back to back, alternating which goes first."""
    times: tuple[list[float], list[float]] = ([], [])
    for k in range(pairs):
        for which in (0, 1) if k % 2 == 0 else (1, 0):
            started = time.perf_counter()
            calls[which]()
            times[which].append(time.perf_counter() - started)
    return statistics.median(times[0]), statistics.median(times[1])


def components_main(args, spec: dict, result: dict) -> dict:
    """`--components`: per adapter, the components ÷ scalar ratio of each round, their median
    and spread."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "service.yaml"
        cfg.write_text(yaml.safe_dump({"scorers": [spec, COMPOSITE]}))
        with running_server(["--config", str(cfg)], Path(tmp), ready_timeout_s=600) as url:
            calls = component_calls(url, args.batch)
            for pair in calls.values():  # warm both routes (connections, the look-ups)
                pair[0](), pair[1]()
            medians: dict[str, list[tuple[float, float]]] = {name: [] for name in calls}
            for k in range(args.rounds):
                for name, pair in calls.items():
                    scalar_s, components_s = paired(pair, args.pairs)
                    medians[name].append((scalar_s, components_s))
                    print(
                        f"round {k} {name:5s} scalar {scalar_s * 1e3:7.1f} ms  components"
                        f" {components_s * 1e3:7.1f} ms  ratio {components_s / scalar_s:.3f}",
                        flush=True,
                    )
    result["settings"] = {k: result["settings"][k] for k in ("shape", "dtype", "batch")}
    result["settings"].update(pairs=args.pairs, rounds=args.rounds, callers=1)
    result["components"] = {}
    for name, rounds in medians.items():
        ratios = [c / s for s, c in rounds]
        result["components"][name] = {
            "median": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
            "rounds": ratios,
            "call_ms": [[round(s * 1e3, 2), round(c * 1e3, 2)] for s, c in rounds],
        }
    return result


def v1_items(prompts: list[str], responses: list[str]) -> list[dict]:
    """`POST /v1/score`'s items (rewardplane's client sends `{"scorers": [...], "items": these}`)."""
    return [
        {"id": str(k), "prompt": p, "response": r}
        for k, (p, r) in enumerate(zip(prompts, responses, strict=True))
    ]


def openrlhf_body(prompts: list[str], responses: list[str]) -> dict:
    """`POST /get_reward`'s body as OpenRLHF sends it: the whole sequence per query, and its prompt."""
    return {
        "query": [p + r for p, r in zip(prompts, responses, strict=True)],
        "prompts": prompts,
        "labels": None,
    }


def unirl_body(prompts: list[str], responses: list[str]) -> dict:
    """`POST /score`'s body (protocol "1"): one request of a prompt turn and a response turn per item."""
    reqs = [
        {"history": [{"text": p}, {"text": r}], "required_rewards": ["rm"], "request_id": str(k)}
        for k, (p, r) in enumerate(zip(prompts, responses, strict=True))
    ]
    return {"protocol_version": "1", "requests": reqs}


def make_calls(url: str, batch: int) -> dict:
    """route -> a function scoring `batch` items once and returning how many it scored."""
    from rewardplane.integrations.trl import RemoteReward
    from rewardplane.integrations.verl import compute_score_async
    from rewardplane.serve.client import RewardClient

    prompts, responses = PROMPTS[:batch], RESPONSES[:batch]
    items = v1_items(prompts, responses)
    local = threading.local()

    def http() -> httpx.Client:
        if not hasattr(local, "http"):
            local.http = httpx.Client(base_url=url, timeout=120)
        return local.http

    def v1_score() -> int:
        if not hasattr(local, "client"):
            local.client = RewardClient(url)
        return len(local.client.score(items, ["rm"]))

    def openrlhf() -> int:
        r = http().post("/get_reward?scorer=rm&mode=split", json=openrlhf_body(prompts, responses))
        r.raise_for_status()
        return len(r.json()["scores"])

    def unirl() -> int:
        r = http().post("/score", json=unirl_body(prompts, responses))
        r.raise_for_status()
        out = r.json()
        assert not any(out["errors"]), out["errors"]
        return len(out["results"])

    def trl() -> int:
        if not hasattr(local, "trl"):
            local.trl = RemoteReward(url, scorer="rm")
        return len(local.trl(prompts=prompts, completions=responses))

    async def verl_chunk() -> list[float]:
        return await asyncio.gather(
            *(
                compute_score_async("bench", r, None, {"prompt": p}, url=url, scorer="rm")
                for p, r in zip(prompts, responses, strict=True)
            )
        )

    def verl() -> int:
        if not hasattr(local, "loop"):  # one event loop per caller, as one per RewardLoopWorker
            local.loop = asyncio.new_event_loop()
        return len(local.loop.run_until_complete(verl_chunk()))

    return {"v1_score": v1_score, "openrlhf": openrlhf, "unirl": unirl, "trl": trl, "verl": verl}


def closed_loop(call, callers: int, warmup: float, seconds: float, start: float | None = None) -> float:
    """Items/s of `callers` threads calling `call` back to back; calls finishing in the window count.
    `start` (a `time.perf_counter()` instant, system-wide monotonic on Linux) lets several client
    processes share one window."""
    start = (time.perf_counter() + warmup) if start is None else start
    stop = start + seconds
    counted = [0] * callers

    def worker(w: int) -> None:
        while time.perf_counter() < stop:
            n = call()
            if start <= time.perf_counter() <= stop:
                counted[w] += n

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counted) / seconds


_CALLS: dict = {}


def _process_loop(job: tuple[str, int, float, float]) -> float:
    route, callers, start, seconds = job
    return closed_loop(_CALLS[route], callers, 0.0, seconds, start=start)


def multi_process_loop(
    calls: dict, route: str, callers: int, processes: int, warmup: float, seconds: float
) -> float:
    """`callers` spread over `processes` forked client processes (threads within each), so the
    client's own GIL (JSON encoding, httpx) does not cap what a fast server can show."""
    import multiprocessing as mp

    if processes <= 1:
        return closed_loop(calls[route], callers, warmup, seconds)
    _CALLS.update(calls)
    start = time.perf_counter() + warmup + 1.0  # 1 s for the forks to come up
    share = [callers // processes + (1 if k < callers % processes else 0) for k in range(processes)]
    with mp.get_context("fork").Pool(processes) as pool:
        rates = pool.map(_process_loop, [(route, n, start, seconds) for n in share if n])
    return sum(rates)


def main(argv=None) -> int:
    import torch

    args = parse_args(argv)
    spec = {
        "name": "rm",
        "kind": "hf_seqcls",
        "shape": args.shape,
        "dtype": args.dtype,
        "max_batch_size": 1024,
        "max_wait_ms": 2.0,
    }
    result = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "python": platform.python_version(),
        },
        "command": " ".join([sys.executable, *sys.argv]),
        "settings": {
            "shape": args.shape,
            "dtype": args.dtype,
            "callers": args.callers,
            "processes": args.processes,
            "batch": args.batch,
            "seconds": args.seconds,
        },
        "routes": {},
    }
    if args.components:
        components_main(args, spec, result)
        if args.out:
            args.out.write_text(json.dumps(result, indent=2))
        print(json.dumps({k: round(v["median"], 3) for k, v in result["components"].items()}))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "service.yaml"
        cfg.write_text(yaml.safe_dump({"scorers": [spec]}))
        with running_server(["--config", str(cfg)], Path(tmp), ready_timeout_s=600) as url:
            calls = make_calls(url, args.batch)
            routes = args.routes.split(",")
            rates: dict[str, list[float]] = {r: [] for r in routes}
            for k in range(args.rounds):  # interleaved and rotated, so drift hits every route alike
                for route in routes[k % len(routes) :] + routes[: k % len(routes)]:
                    rates[route].append(
                        multi_process_loop(
                            calls, route, args.callers, args.processes, args.warmup, args.seconds
                        )
                    )
                    print(f"round {k} {route:10s} {rates[route][-1]:9.1f} items/s", flush=True)
            for route, values in rates.items():
                result["routes"][route] = {"items_per_s": statistics.median(values), "rounds": values}
    base = result["routes"].get("v1_score", {}).get("items_per_s")
    for row in result["routes"].values():
        row["vs_v1_score"] = row["items_per_s"] / base if base else None
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: round(v["vs_v1_score"] or 0, 3) for k, v in result["routes"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
