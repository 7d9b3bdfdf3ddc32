"""Server CPU per item of the trainer routes against `POST /v1/score`, in process (issue 21).

The app (`create_app`) is driven through its ASGI callable, with each body encoded once up front
and answers left unparsed, so nearly all CPU this process spends is the server's: routing, body
parsing and validation, building items, the backend, building and encoding the answer. Every
route gets the same 64 text items per call, in the bodies `benchmarks/integrations.py` sends:
`v1_score` (`POST /v1/score`), `unirl` (`POST /score`, UniRL protocol "1", a prompt turn and a
response turn per request) and `openrlhf` (`POST /get_reward?mode=split`).

`--scorer`: `none`, a backend that answers at once (the route's own cost); `len`, the `length`
rule through the in-process batcher; `rm`, `hf_seqcls` `tiny-text-rm` with its forward replaced
by zeros (admission: chat template, prompt cache, tokenisation; on a GPU the forward is the
device's time).

Routes are interleaved over `--rounds` rounds of `--requests` calls (`--concurrency` in flight);
reported per route: `time.process_time()` µs per item, median and minimum over rounds (the
minimum is the steadier on a shared machine), each with its ratio to `v1_score`. `--gc off`
measures without the cyclic GC; `--profile ROUTE` prints a cProfile of one route instead.

    python benchmarks/route_cost.py --scorer none --requests 50 --rounds 30
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import pstats
import statistics
import sys
import time

from integrations import PROMPTS, RESPONSES, openrlhf_body, unirl_body, v1_items  # same items, same bodies
from rewardplane.serve.app import create_app
from rewardplane.serve.backend import InProcessBackend
from rewardplane.serve.config import config_from_dict


def bodies(batch: int) -> dict[str, tuple[str, str, bytes]]:
    """route -> (path, query string, JSON body): the bodies benchmarks/integrations.py sends."""
    prompts, responses = PROMPTS[:batch], RESPONSES[:batch]
    v1 = {"scorers": ["rm"], "items": v1_items(prompts, responses)}
    return {
        "v1_score": ("/v1/score", "", json.dumps(v1).encode()),
        "unirl": ("/score", "", json.dumps(unirl_body(prompts, responses)).encode()),
        "openrlhf": (
            "/get_reward",
            "scorer=rm&mode=split",
            json.dumps(openrlhf_body(prompts, responses)).encode(),
        ),
    }


async def call(app, path: str, query: str, body: bytes) -> int:
    """One request through the ASGI app; the response status."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    sent = False
    status = 0
    out: list[bytes] = []

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message):
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            out.append(message.get("body", b""))

    await app(scope, receive, send)
    if status != 200:
        raise RuntimeError(f"{path}: {status} {b''.join(out)[:300]!r}")
    return status


async def run_route(app, spec, requests: int, concurrency: int) -> float:
    """process_time seconds for `requests` calls, `concurrency` at a time."""
    path, query, body = spec
    left = requests

    async def worker():
        nonlocal left
        while left > 0:
            left -= 1
            await call(app, path, query, body)

    t0 = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.process_time() - t0


class InstantBackend:
    """A backend that answers 1.0 per item at once: what is left is the route's own cost."""

    def __init__(self) -> None:
        from rewardplane.serve.protocol import ScorerInfo

        self.info = ScorerInfo("rm", "instant", "text", "none", "cpu", "0", "instant-0", 1024, 0.0)

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def score(self, scorer, items):
        return [1.0] * len(items)

    def scorer_infos(self):
        return {"rm": self.info}

    def scorer_names(self):
        return ["rm"]

    def ready(self):
        return True, {"rm": "ready"}


def build(scorer: str):
    if scorer == "none":
        config = config_from_dict({"scorers": [{"name": "rm", "kind": "length"}]})
        backend = InstantBackend()
        return backend, create_app(backend, config)
    if scorer == "rm":
        spec = {"name": "rm", "kind": "hf_seqcls", "shape": "tiny-text-rm", "device": "cpu"}
    else:
        spec = {"name": "rm", "kind": "length"}
    spec.update(max_batch_size=1024, max_wait_ms=1.0)
    config = config_from_dict({"scorers": [spec]})
    backend = InProcessBackend(config)
    return backend, create_app(backend, config)


def stub_forward(backend) -> None:
    """Zeros instead of the model's forward: admission is measured, the model is not."""
    scorer = getattr(backend, "_scorers", {}).get("rm")
    if scorer is not None and scorer.kind == "hf_seqcls":
        scorer.score_prepared = lambda batch: [0.0 if isinstance(x, list) else x for x in batch]


async def main_async(args) -> int:
    backend, app = build(args.scorer)
    await backend.start()
    stub_forward(backend)
    specs = bodies(args.batch)
    routes = args.routes.split(",")
    try:
        for r in routes:  # warm-up: prompt cache, lazy imports
            await run_route(app, specs[r], 20, args.concurrency)
        if args.gc == "off":
            gc.disable()
        elif args.gc == "freeze":
            gc.collect()
            gc.freeze()
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            await run_route(app, specs[args.profile], args.requests, args.concurrency)
            prof.disable()
            pstats.Stats(prof).sort_stats(args.sort).print_stats(args.top)
            return 0
        per_item: dict[str, list[float]] = {r: [] for r in routes}
        for k in range(args.rounds):
            for r in routes[k % len(routes) :] + routes[: k % len(routes)]:
                cpu = await run_route(app, specs[r], args.requests, args.concurrency)
                per_item[r].append(cpu / (args.requests * args.batch) * 1e6)
        base = statistics.median(per_item[routes[0]])
        print(
            f"scorer={args.scorer} batch={args.batch} requests={args.requests} rounds={args.rounds}"
            f" concurrency={args.concurrency} gc={args.gc}"
        )
        low = min(per_item[routes[0]])
        print(
            f"{'route':10s} {'median':>7s} {'ratio':>6s} {'min':>7s} {'ratio':>6s}  (µs/item, vs {routes[0]})"
        )
        for r, values in per_item.items():
            med, least = statistics.median(values), min(values)
            print(f"{r:10s} {med:7.2f} {med / base:6.3f} {least:7.2f} {least / low:6.3f}")
    finally:
        await backend.stop()
    return 0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scorer", choices=("rm", "len", "none"), default="rm")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--requests", type=int, default=300, help="calls per route per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--routes", default="v1_score,unirl,openrlhf", help="the first is the reference")
    p.add_argument(
        "--gc",
        choices=("on", "off", "freeze"),
        default="on",
        help="off: no cyclic GC while measuring; freeze: gc.freeze() after start-up",
    )
    p.add_argument("--profile", default=None, help="cProfile this route instead of timing")
    p.add_argument("--sort", default="cumulative")
    p.add_argument("--top", type=int, default=45)
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main_async(parse_args())))
