"""A small stand-in for `rewardplane serve` that the bench tests drive (in-process or as a process).

Scores are a hash of (scorer, item content), so they are deterministic across restarts, and
a per-mode offset lets a test break parity on purpose. Per-scorer faults inject exactly the
malformed responses the load generator must reject: NaN, booleans, nulls, strings, a missing
scorer, a service-reported error, dropped/extra/reordered ids and HTTP 500.

Run as a process: `python tests/support/bench_fake_server.py --deploy deploy.yaml --port P`, with
options in the BENCH_FAKE environment variable (JSON: per-mode `faults` and `offsets`,
`delay_ms`, and `fail_modes`: modes whose server exits at once with code 3).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from rewardplane.bench.server import free_port
from rewardplane.serve.protocol import timing_headers


def fake_score(scorer: str, item: dict[str, Any]) -> float:
    image = (item.get("image") or {}).get("b64", "")
    digest = hashlib.sha256(json.dumps([scorer, item["prompt"], item["response"], image]).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * 2 - 1


def make_app(
    scorers: list[str],
    *,
    mode: str = "shared",
    faults: dict[str, str] | None = None,
    offset: float = 0.0,
    delay_ms: float = 1.0,
    token: str | None = None,
) -> FastAPI:
    faults = faults or {}
    app = FastAPI()
    registry = CollectorRegistry()
    batch_hist = Histogram(
        "rewardplane_batch_size",
        "items per batch",
        ["scorer"],
        registry=registry,
        buckets=(1, 2, 4, 8, 16, 32, 64),
    )

    @app.get("/health/ready")
    async def ready() -> dict[str, str]:
        return {"status": "ready"}

    @app.get("/v1/scorers")
    async def list_scorers() -> dict[str, Any]:
        return {"scorers": [{"name": s, "version": "1", "identity": f"fake-{s}"} for s in scorers]}

    @app.get("/v1/deployment")
    async def deployment() -> dict[str, Any]:
        return {"mode": mode, "workers": 1, "gpus": {}, "mps": {"enabled": mode.startswith("mps")}}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type="text/plain")

    @app.post("/v1/score")
    async def score(request: Request) -> Response:
        if token is not None and request.headers.get("authorization") != f"Bearer {token}":
            return JSONResponse({"code": "unauthorized", "message": "bad token"}, status_code=401)
        started = time.perf_counter()
        body = await request.json()
        wanted, items = body["scorers"], body["items"]
        unknown = [s for s in wanted if s not in scorers]
        if unknown:
            return JSONResponse({"code": "unknown_scorer", "message": str(unknown)}, status_code=400)
        if any(faults.get(s) == "http500" for s in wanted):
            return JSONResponse({"code": "internal", "message": "boom"}, status_code=500)
        await asyncio.sleep(delay_ms / 1000 * (1 + 0.05 * len(items)))
        results = []
        for item in items:
            scores: dict[str, Any] = {}
            errors: dict[str, Any] = {}
            for s in wanted:
                fault = faults.get(s)
                value: Any = fake_score(s, item) + offset
                if fault == "nan":
                    value = float("nan")
                elif fault == "inf":
                    value = float("inf")
                elif fault == "bool":
                    value = True
                elif fault == "none":
                    value = None
                elif fault == "string":
                    value = "0.5"
                if fault == "missing":
                    continue
                if fault == "error":
                    errors[s] = {"code": "non_finite", "message": "scorer returned NaN"}
                    continue
                scores[s] = value
            results.append({"id": item["id"], "scores": scores, "errors": errors})
        for s in wanted:
            batch_hist.labels(scorer=s).observe(len(items))
        all_faults = {faults.get(s) for s in wanted}
        if "drop_id" in all_faults:
            results = results[:-1]
        if "extra_id" in all_faults:
            results.append({"id": "not-requested", "scores": {}, "errors": {}})
        if "reorder" in all_faults and len(results) > 1:
            results = results[::-1]
        payload = {
            "results": results,
            "scorers": {s: {"version": "1", "identity": f"fake-{s}"} for s in wanted},
        }
        elapsed = time.perf_counter() - started
        headers = timing_headers(queue_s=elapsed * 0.25, inference_s=elapsed * 0.75, total_s=elapsed)
        # json.dumps (not JSONResponse) so NaN/Infinity reach the client as the broken literals they are
        return Response(json.dumps(payload, allow_nan=True), media_type="application/json", headers=headers)

    return app


@contextlib.contextmanager
def serve_in_thread(app: FastAPI) -> Iterator[str]:
    """Run `app` on a loopback port in a background thread; yield its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120  # a ceiling for a starved machine
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("fake server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deploy", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    with open(args.deploy) as handle:
        deploy = yaml.safe_load(handle)
    options = json.loads(os.environ.get("BENCH_FAKE", "{}"))
    mode = deploy["mode"]
    if mode in options.get("fail_modes", []):
        print(f"fake server: refusing to start mode {mode}", file=sys.stderr)
        return 3
    app = make_app(
        [s["name"] for s in deploy["scorers"]],
        mode=mode,
        faults=options.get("faults", {}).get(mode),
        offset=options.get("offsets", {}).get(mode, 0.0),
        delay_ms=options.get("delay_ms", 1.0),
    )
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
