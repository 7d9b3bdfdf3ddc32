"""Reward-service throughput: our batched service vs a naive one-request-one-forward baseline.

For each CLIP shape x dtype, and each request batch size x client concurrency, a closed-loop
load generator (`rewardplane.bench.loadgen.timed_closed_loop`) measures items/s and p50/p99
request latency in three modes, side by side:

- `http`:   rewardplane serve (dynamic batching, GPU decode+preprocess) in a subprocess, over HTTP
            with base64 JPEGs in JSON;
- `inproc`: the same InProcessBackend called directly (no HTTP/JSON/base64): the batching ceiling;
- `naive`:  the seed-service design in the same server process: one request -> one forward under a
            lock, CPU Pillow preprocessing, base64 JPEG, no cross-request batching.

MFU = pairs/s x FLOP per pair / 790 TFLOP/s (H200 dense bf16), with ~175 GFLOP per ViT-L/14 pair
and ~380 GFLOP per ViT-H/14 pair at 224 px.

    PYTHONPATH=src python3 benchmarks/serve.py --out serve.json            # CUDA: full grid (~4 min)
    PYTHONPATH=src python3 benchmarks/serve.py --smoke --out smoke.json    # CPU: tiny-clip, small grid
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

FLOP_PER_PAIR = {"clip-vit-l-14": 175e9, "clip-vit-h-14": 380e9}
PEAK_FLOPS = 790e12
PROMPTS = [
    f"a photo of {x}"
    for x in (
        "a cat",
        "a dog on a beach",
        "an astronaut riding a horse",
        "a red cube",
        "a bowl of fruit",
        "a city at night",
        "a mountain lake",
        "a robot painting",
    )
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="CPU: tiny-clip fp32, batch 1/4 x concurrency 1/4")
    p.add_argument("--out", type=Path, required=False, help="write the JSON result here")
    p.add_argument("--shapes", default=None, help="comma list (default clip-vit-l-14,clip-vit-h-14)")
    p.add_argument("--dtypes", default=None, help="comma list (default fp16,bf16)")
    p.add_argument(
        "--batches", default=None, help="items per request (default: the bench sweep's, bench/sweep.py)"
    )
    p.add_argument("--concurrency", default=None, help="concurrent clients (default: the bench sweep's)")
    p.add_argument("--modes", default="naive,http,inproc")
    p.add_argument(
        "--transport",
        choices=["json", "multipart"],
        default="json",
        help="http mode: base64 JSON or raw parts",
    )
    p.add_argument("--cell-seconds", type=float, default=None, help="measured seconds per cell")
    p.add_argument("--warmup-seconds", type=float, default=None)
    p.add_argument("--max-batch-size", type=int, default=128)
    p.add_argument("--max-wait-ms", type=float, default=2.0)
    p.add_argument(
        "--no-prefetch", action="store_true", help="prefetch_images: false (each batch decodes its own)"
    )
    p.add_argument(
        "--decode", choices=("device", "host"), default="device", help="the scorers' decode option"
    )
    p.add_argument("--cuda-graphs", action="store_true", help="the scorers' cuda_graphs option")
    p.add_argument("--image-size", type=int, default=256, help="side of the JPEGs sent")
    p.add_argument(
        "--server-backend",
        choices=("inproc", "workers"),
        default="inproc",
        help="http mode's server: scorers in the HTTP process (`serve --config`), or a gateway in "
        "front of one dedicated worker process (`serve --deploy`, no naive routes)",
    )
    p.add_argument(
        "--switch-interval-ms",
        type=float,
        default=None,
        help="sys.setswitchinterval in the inproc server (Python's default is 5 ms)",
    )
    # internal: run the server side (rewardplane app + naive routes) in this process
    p.add_argument("--server", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    smoke = args.smoke
    args.shapes = (args.shapes or ("tiny-clip" if smoke else "clip-vit-l-14,clip-vit-h-14")).split(",")
    args.dtypes = (args.dtypes or ("fp32" if smoke else "fp16,bf16")).split(",")
    from rewardplane.bench.sweep import Sweep  # the one definition of the load and its defaults

    sweep = Sweep()
    args.batches = (
        [int(x) for x in args.batches.split(",")] if args.batches else [1, 4] if smoke else sweep.batch
    )
    args.concurrency = (
        [int(x) for x in args.concurrency.split(",")]
        if args.concurrency
        else [1, 4]
        if smoke
        else sweep.concurrency
    )
    args.modes = args.modes.split(",")
    if args.server_backend == "workers" and "naive" in args.modes:
        p.error("--server-backend workers has no naive routes: drop naive from --modes")
    if args.server_backend == "workers" and args.switch_interval_ms:
        p.error("--switch-interval-ms applies to the inproc server only")
    args.cell_seconds = args.cell_seconds or (1.5 if smoke else 1.0)
    args.warmup_seconds = args.warmup_seconds if args.warmup_seconds is not None else (0.5 if smoke else 0.3)
    return args


def scorer_name(shape: str, dtype: str) -> str:
    return f"{shape}-{dtype}"


def make_images(n: int, size: int) -> list[bytes]:
    """Smooth, distinct JPEGs (like generated images; noise would inflate JPEG decode cost)."""
    import numpy as np
    from PIL import Image

    out = []
    y, x = np.mgrid[0:size, 0:size]
    for k in range(n):
        arr = np.stack(
            [
                127 + 120 * np.sin((x + 9 * k) / (11.0 + k)),
                127 + 120 * np.cos((y - 5 * k) / 17.0),
                (x * 3 + y * 2 + 29 * k) % 256,
            ],
            -1,
        ).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


# ----------------------------------------------------------------------------------------------- server side


class NaiveClip:
    """The seed-service baseline: per request, CPU Pillow preprocessing and one forward, under a lock."""

    def __init__(self, shape: str, dtype: str, device: str) -> None:
        import torch
        from transformers import CLIPModel

        from rewardplane.serve.scorers.clip import shape_config, shape_tokenizer
        from rewardplane.serve.scorers.common import torch_dtype

        self.tokenizer = shape_tokenizer()
        self.dtype, self.device = torch_dtype(dtype), device
        torch.manual_seed(0)
        with torch.device(device):
            self.model = CLIPModel._from_config(shape_config(shape, self.tokenizer), dtype=self.dtype).eval()
        self.size = self.model.config.vision_config.image_size
        self.lock = threading.Lock()

    def preprocess(self, data: bytes):
        import numpy as np
        from PIL import Image

        from rewardplane.serve.images import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

        with Image.open(io.BytesIO(data)) as img:
            img = img.convert("RGB")
            w, h = img.size
            s = self.size / min(w, h)
            img = img.resize((max(self.size, round(w * s)), max(self.size, round(h * s))), Image.BICUBIC)
            left, top = (img.width - self.size) // 2, (img.height - self.size) // 2
            img = img.crop((left, top, left + self.size, top + self.size))
            arr = np.asarray(img, dtype=np.float32) / 255.0
        return (
            (arr - np.array(OPENAI_CLIP_MEAN, np.float32)) / np.array(OPENAI_CLIP_STD, np.float32)
        ).transpose(2, 0, 1)

    def score(self, items: list[dict]) -> list[float]:
        import numpy as np
        import torch

        pixels = torch.from_numpy(
            np.stack([self.preprocess(base64.b64decode(i["image"]["b64"])) for i in items])
        )
        enc = self.tokenizer(
            [i["prompt"] for i in items], padding=True, truncation=True, max_length=77, return_tensors="pt"
        )
        with self.lock, torch.inference_mode():
            out = self.model(
                input_ids=enc["input_ids"].to(self.device),
                attention_mask=enc["attention_mask"].to(self.device),
                pixel_values=pixels.to(self.device, self.dtype),
            )
            return out.logits_per_image.diagonal().float().cpu().tolist()


def run_server(config_path: Path, port: int) -> None:
    import uvicorn

    from rewardplane.serve.app import create_app
    from rewardplane.serve.backend import InProcessBackend
    from rewardplane.serve.config import load_config

    config = load_config(config_path)
    app = create_app(InProcessBackend(config), config)
    naive = {s.name: NaiveClip(s.shape, s.dtype, s.resolved_device()) for s in config.scorers}

    @app.post("/naive/{name}")
    def naive_score(name: str, body: dict) -> dict:  # sync: starlette runs it on its thread pool
        return {"scores": naive[name].score(body["items"])}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# ----------------------------------------------------------------------------------------------- client side


class HttpLoad:
    """A closed-loop HTTP load generator on aiohttp when installed (the GPU box), else httpx."""

    def __init__(self, base: str, max_conn: int) -> None:
        self.base = base
        self.max_conn = max_conn

    async def __aenter__(self):
        try:
            import aiohttp

            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self.max_conn))
            self.kind = "aiohttp"
        except ImportError:
            import httpx

            self._session = httpx.AsyncClient(limits=httpx.Limits(max_connections=self.max_conn), timeout=120)
            self.kind = "httpx"
        return self

    async def __aexit__(self, *exc):
        if self.kind == "aiohttp":
            await self._session.close()
        else:
            await self._session.aclose()

    async def post(
        self, path: str, body: bytes, content_type: str = "application/json"
    ) -> tuple[int, dict, tuple[float | None, float | None]]:
        """(status, JSON body, (queue ms, inference ms) from the timing headers)."""
        from rewardplane.serve.protocol import INFERENCE_TIME_HEADER, QUEUE_TIME_HEADER, header_ms

        headers = {"content-type": content_type}
        if self.kind == "aiohttp":
            async with self._session.post(self.base + path, data=body, headers=headers) as r:
                status, payload, got = r.status, json.loads(await r.read()), r.headers
        else:
            r = await self._session.post(self.base + path, content=body, headers=headers)
            status, payload, got = r.status_code, r.json(), r.headers
        return status, payload, (header_ms(got, QUEUE_TIME_HEADER), header_ms(got, INFERENCE_TIME_HEADER))


def request_bodies(images: list[bytes], batch: int, n: int = 16) -> list[bytes]:
    b64 = [base64.b64encode(i).decode() for i in images]
    bodies = []
    for r in range(n):
        items = [
            {
                "id": f"r{r}-{j}",
                "prompt": PROMPTS[(r + j) % len(PROMPTS)],
                "image": {"b64": b64[(r * batch + j) % len(b64)]},
            }
            for j in range(batch)
        ]
        bodies.append(items)
    return bodies


def encode_request(items: list[dict], scorer: str, transport: str) -> tuple[bytes, str]:
    """One POST /v1/score body and its content type, built by the client's own encoder:
    `json` carries base64 images, `multipart` raw image parts (no base64 either way round)."""
    import httpx

    from rewardplane.serve.client import score_request_kwargs

    request = httpx.Request(
        "POST",
        "http://bench/v1/score",
        **score_request_kwargs(items, [scorer], None, transport == "multipart"),
    )
    return request.read(), request.headers["content-type"]


async def run_cells(args, url: str, backend, images: list[bytes]) -> list[dict]:
    from rewardplane.bench.loadgen import CallResult, timed_closed_loop
    from rewardplane.serve.protocol import SCORE_ROUTE, ScoreItem

    cells = []
    async with HttpLoad(url, max(args.concurrency) + 4) as load:
        for shape in args.shapes:
            for dtype in args.dtypes:
                name = scorer_name(shape, dtype)
                for mode in args.modes:
                    for batch in args.batches:
                        item_sets = request_bodies(images, batch)
                        ours = [encode_request(items, name, args.transport) for items in item_sets]
                        naive = [json.dumps({"items": items}).encode() for items in item_sets]
                        direct = [
                            [
                                ScoreItem(i["id"], i["prompt"], "", base64.b64decode(i["image"]["b64"]))
                                for i in items
                            ]
                            for items in item_sets
                        ]
                        for conc in args.concurrency:

                            async def call(
                                k, mode=mode, batch=batch, ours=ours, naive=naive, direct=direct, name=name
                            ):
                                if mode == "http":
                                    status, body, timing = await load.post(SCORE_ROUTE, *ours[k % len(ours)])
                                    if status != 200:
                                        return CallResult(0, batch)
                                    bad = sum(1 for r in body["results"] if r["errors"])
                                    return CallResult(batch - bad, bad, *timing)
                                if mode == "naive":
                                    status, body, _ = await load.post(f"/naive/{name}", naive[k % len(naive)])
                                    return CallResult(batch, 0) if status == 200 else CallResult(0, batch)
                                results = await backend.score(name, direct[k % len(direct)])
                                bad = sum(1 for r in results if not isinstance(r, float))
                                return CallResult(batch - bad, bad)

                            load_cell = await timed_closed_loop(
                                call, conc, args.warmup_seconds, args.cell_seconds
                            )
                            cell = {
                                "items_per_s": load_cell.items_per_s,
                                "requests": load_cell.requests,
                                "errors": load_cell.failed_items,
                                "p50_ms": load_cell.p50_ms,
                                "p99_ms": load_cell.p99_ms,
                                "mean_queue_ms": load_cell.mean_queue_ms,
                                "mean_inference_ms": load_cell.mean_inference_ms,
                            }
                            flop = FLOP_PER_PAIR.get(shape)
                            cell.update(
                                shape=shape,
                                dtype=dtype,
                                mode=mode,
                                batch=batch,
                                concurrency=conc,
                                transport=args.transport if mode == "http" else None,
                                mfu=(cell["items_per_s"] * flop / PEAK_FLOPS) if flop else None,
                            )
                            cells.append(cell)
                            print(
                                f"{shape:14s} {dtype} {mode:6s} b={batch:<2d} c={conc:<2d} "
                                f"{cell['items_per_s']:9.1f} items/s  p50 {cell['p50_ms'] or 0:8.2f} ms  "
                                f"p99 {cell['p99_ms'] or 0:8.2f} ms  err {cell['errors']}"
                                + (f"  MFU {cell['mfu'] * 100:5.1f}%" if cell["mfu"] is not None else ""),
                                flush=True,
                            )
    return cells


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if args.smoke:
        # The CPU box is shared: two OpenMP pools (this process and the server) oversubscribing two
        # cores stall at every barrier, which would measure the scheduler, not the service.
        torch.set_num_threads(1)
    if args.server:
        if args.switch_interval_ms:
            sys.setswitchinterval(args.switch_interval_ms / 1000)
        run_server(args.server, args.port)
        return 0
    import transformers
    import yaml

    from rewardplane.bench.server import running_server, serve_command
    from rewardplane.serve.backend import InProcessBackend
    from rewardplane.serve.config import config_from_dict

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if not args.smoke and device == "cpu":
        print("no CUDA: use --smoke for the CPU configuration", file=sys.stderr)
        return 2
    raw = {
        "scorers": [
            {
                "name": scorer_name(s, d),
                "kind": "clip",
                "shape": s,
                "dtype": d,
                "device": device,
                "max_batch_size": args.max_batch_size,
                "max_wait_ms": args.max_wait_ms,
                "max_queue": 100000,
                "options": {"decode": args.decode, **({"cuda_graphs": True} if args.cuda_graphs else {})},
            }
            for s in args.shapes
            for d in args.dtypes
        ],
        "limits": {"max_items": 4096, "max_body_bytes": 256 * 1024 * 1024},
        "prefetch_images": not args.no_prefetch,
    }
    images = make_images(64, args.image_size)
    with tempfile.TemporaryDirectory() as tmp:
        cfg_path = Path(tmp) / "service.yaml"
        if args.server_backend == "workers":
            deploy = {**raw, "mode": "dedicated", "gpus": [0] if device == "cuda" else []}
            cfg_path.write_text(yaml.safe_dump(deploy))
            command = serve_command(["--deploy", str(cfg_path), "--log-level", "warning"])
        else:
            cfg_path.write_text(yaml.safe_dump(raw))
            command = ["{python}", __file__, "--server", str(cfg_path)]
            if args.switch_interval_ms:
                command += ["--switch-interval-ms", str(args.switch_interval_ms)]
            command += ["--port", "{port}"]
        started = time.perf_counter()
        # bench/server.py: own session, SIGTERM if we die, ready under a deadline, log tail on failure
        server = running_server([], Path(tmp), command=command, env={"PYTHONUNBUFFERED": "1"},
                                ready_timeout_s=600, stop_timeout_s=20, label="serve benchmark")  # fmt: skip
        with server as url:
            backend = InProcessBackend(config_from_dict(raw))

            async def go():
                await backend.start()
                ok, details = backend.ready()
                if not ok:
                    raise RuntimeError(f"in-process backend not ready: {details}")
                print(f"setup {time.perf_counter() - started:.1f}s", flush=True)
                try:
                    return await run_cells(args, url, backend, images)
                finally:
                    await backend.stop()

            cells = asyncio.run(go())
    result = {
        "meta": {
            "device": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu",
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "smoke": args.smoke,
            "cell_seconds": args.cell_seconds,
            "max_batch_size": args.max_batch_size,
            "max_wait_ms": args.max_wait_ms,
            "prefetch_images": not args.no_prefetch,
            "decode": args.decode,
            "cuda_graphs": args.cuda_graphs,
            "transport": args.transport,
            "server_backend": args.server_backend,
            "switch_interval_ms": args.switch_interval_ms,
            "image_size": args.image_size,
            "peak_flops": PEAK_FLOPS,
            "flop_per_pair": FLOP_PER_PAIR,
            "total_s": time.perf_counter() - started,
        },
        "cells": cells,
    }
    summary = {}
    for c in cells:
        if c["concurrency"] == max(args.concurrency):
            summary.setdefault((c["shape"], c["dtype"], c["batch"]), {})[c["mode"]] = c["items_per_s"]
    result["speedup_vs_naive_at_max_concurrency"] = [
        {
            "shape": k[0],
            "dtype": k[1],
            "batch": k[2],
            **{m: v for m, v in modes.items()},
            "http_over_naive": modes["http"] / modes["naive"]
            if modes.get("naive") and "http" in modes
            else None,
        }
        for k, modes in summary.items()
    ]
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result["speedup_vs_naive_at_max_concurrency"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
