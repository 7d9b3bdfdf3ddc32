"""Gateway-hop overhead: items/s and latency through gateway → worker vs the same scorer in-process.

Both sides are the `ScoringBackend` API the HTTP app calls, so HTTP/JSON cost is excluded and
the difference is exactly the deploy hop: frame encode → Unix socket → worker decode →
the worker's own batcher → results back. A closed-loop load generator
(`rewardplane.bench.loadgen.timed_closed_loop`) runs `concurrency` clients, each sending requests
of `batch` items back to back, for every grid cell; the
in-process backend and the gateway run one after the other so they never share the device.

    PYTHONPATH=src python3 benchmarks/deploy_overhead.py --out deploy.json           # CUDA: clip-vit-l-14 fp16
    PYTHONPATH=src python3 benchmarks/deploy_overhead.py --smoke --out smoke.json    # CPU: length + tiny-clip

Goal (issue 7): at batch 8 x concurrency 16 on the H200 the hop costs <= 5% of items/s.
Needs (besides torch/transformers/Pillow): pyyaml and prometheus-client (the serve batcher).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import io
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

GOAL_CELL = (8, 16)
GOAL_PCT = 5.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="CPU: length rule + tiny-clip fp32, short cells")
    p.add_argument("--out", type=Path, help="write the JSON result here")
    p.add_argument("--scorers", help="comma list of kind:shape:dtype (default by device)")
    p.add_argument(
        "--grid", help="comma list of BATCHxCONCURRENCY (default 8x16,1x16,8x1,32x16; smoke 8x16,1x16,8x1)"
    )
    p.add_argument("--seconds", type=float, help="measured seconds per cell (default 8 CUDA, 3 smoke)")
    p.add_argument("--warmup", type=float, default=None, help="unmeasured seconds per cell")
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--max-wait-ms", type=float, default=2.0)
    args = p.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available() and not args.smoke
    args.device = "cuda" if cuda else "cpu"
    default_scorers = "clip:clip-vit-l-14:fp16" if cuda else "length::fp32,clip:tiny-clip:fp32"
    args.scorer_list = [tuple(s.split(":")) for s in (args.scorers or default_scorers).split(",")]
    grid = args.grid or ("8x16,1x16,8x1,32x16" if cuda else "8x16,1x16,8x1")
    args.cells = [tuple(int(v) for v in cell.split("x")) for cell in grid.split(",")]
    args.seconds = args.seconds or (8.0 if cuda else 5.0)
    args.warmup = args.warmup if args.warmup is not None else (2.0 if cuda else 1.0)
    return args


def make_items(n: int, with_image: bool) -> list[Any]:
    import numpy as np
    from PIL import Image

    from rewardplane.serve.protocol import ScoreItem

    rng = np.random.default_rng(0)
    items = []
    for k in range(n):
        image = None
        if with_image:
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 255, (256, 256, 3), dtype=np.uint8)).save(buf, format="JPEG")
            image = buf.getvalue()
        items.append(ScoreItem(id=str(k), prompt=f"a photo of thing {k}", response=f"thing {k}", image=image))
    return items


async def load(
    backend: Any, name: str, items: list[Any], concurrency: int, seconds: float, warmup: float
) -> dict:
    """Closed loop: `concurrency` clients send `items` back to back; measure after warm-up."""
    from rewardplane.bench.loadgen import CallResult, timed_closed_loop

    async def call(_: int) -> CallResult:
        results = await backend.score(name, items)
        bad = sum(not isinstance(r, float) for r in results)
        return CallResult(len(items) - bad, bad)

    cell = await timed_closed_loop(call, concurrency, warmup, seconds)
    return {
        "items_per_s": cell.items_per_s,
        "requests": cell.requests,
        "item_errors": cell.failed_items,
        "p50_ms": cell.p50_ms,
        "p99_ms": cell.p99_ms,
    }


def spec(kind: str, shape: str, dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    s: dict[str, Any] = {
        "name": "bench",
        "kind": kind,
        "dtype": dtype,
        "max_batch_size": args.max_batch_size,
        "max_wait_ms": args.max_wait_ms,
        "max_queue": 1 << 16,
    }
    if shape:
        s["shape"] = shape
    if kind != "length":
        s["device"] = args.device
    return s


async def run_mode(
    mode: str, scorer_spec: dict[str, Any], args: argparse.Namespace, with_image: bool
) -> list[dict]:
    if mode == "inproc":
        from rewardplane.serve.backend import InProcessBackend
        from rewardplane.serve.config import config_from_dict

        backend: Any = InProcessBackend(config_from_dict({"scorers": [scorer_spec]}))
    else:
        from rewardplane.deploy.config import parse_deploy_config
        from rewardplane.deploy.gateway import GatewayBackend

        gpus = [0] if args.device == "cuda" else []
        backend = GatewayBackend(
            parse_deploy_config({"mode": "dedicated", "gpus": gpus, "scorers": [scorer_spec]})
        )
    t0 = time.perf_counter()
    await backend.start()
    ok, details = backend.ready()
    if not ok:
        raise SystemExit(f"{mode}: backend not ready: {details}")
    load_s = time.perf_counter() - t0
    rows = []
    try:
        for batch, conc in args.cells:
            items = make_items(batch, with_image)
            r = await load(backend, "bench", items, conc, args.seconds, args.warmup)
            rows.append({"mode": mode, "batch": batch, "concurrency": conc, "load_s": load_s, **r})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        await backend.stop()
    return rows


def versions() -> dict[str, str]:
    import torch
    import transformers

    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
        out["cuda"] = str(torch.version.cuda)
    return out


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results, summary = [], []
    for kind, shape, dtype in args.scorer_list:
        s = spec(kind, shape, dtype, args)
        with_image = kind in ("clip", "pickscore")
        rows = {}
        for mode in ("inproc", "gateway"):
            for row in asyncio.run(run_mode(mode, s, args, with_image)):
                row["scorer"] = f"{kind}:{shape}:{dtype}"
                results.append(row)
                rows[(mode, row["batch"], row["concurrency"])] = row
            gc.collect()
            if args.device == "cuda":
                import torch

                torch.cuda.empty_cache()
        for batch, conc in args.cells:
            a, b = rows[("inproc", batch, conc)], rows[("gateway", batch, conc)]
            cost = 100.0 * (1 - b["items_per_s"] / a["items_per_s"]) if a["items_per_s"] else None
            summary.append(
                {
                    "scorer": f"{kind}:{shape}:{dtype}",
                    "batch": batch,
                    "concurrency": conc,
                    "inproc_items_per_s": a["items_per_s"],
                    "gateway_items_per_s": b["items_per_s"],
                    "hop_cost_pct": cost,
                    "p50_ms_inproc": a["p50_ms"],
                    "p50_ms_gateway": b["p50_ms"],
                    "p99_ms_inproc": a["p99_ms"],
                    "p99_ms_gateway": b["p99_ms"],
                }
            )
    goal = [
        s
        for s in summary
        if (s["batch"], s["concurrency"]) == GOAL_CELL and not s["scorer"].startswith("length")
    ]
    report = {
        "benchmark": "deploy_overhead",
        "device": args.device,
        "cpu_count": os.cpu_count(),
        "versions": versions(),
        "settings": {
            "seconds": args.seconds,
            "warmup": args.warmup,
            "max_batch_size": args.max_batch_size,
            "max_wait_ms": args.max_wait_ms,
            "cells": args.cells,
        },
        "summary": summary,
        "goal": [
            {
                **g,
                "goal_pct": GOAL_PCT,
                "pass": g["hop_cost_pct"] is not None and g["hop_cost_pct"] <= GOAL_PCT,
            }
            for g in goal
        ],
        "results": results,
    }
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text)
    for s in summary:
        print(
            f"{s['scorer']:28s} b={s['batch']:<3d} c={s['concurrency']:<3d} "
            f"inproc {_fmt(s['inproc_items_per_s'])}/s gateway {_fmt(s['gateway_items_per_s'])}/s "
            f"hop {_fmt(s['hop_cost_pct'])}%  p50 {_fmt(s['p50_ms_inproc'])} -> {_fmt(s['p50_ms_gateway'])} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
