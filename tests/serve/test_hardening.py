"""Issue 23's contract through a real `rewardplane serve` process over real HTTP (docs/reliability.md).

One section per contract line: whole-request problems are 4xx `{"code","message"}` and every
response is counted in /metrics; 413 `too_large` for a request no queue can admit; start-up
failures exit 2 with one line; the token never comes from argv; fairness under a near-limit body.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest

from support.hostile import served
from support.serve import LiveServer, make_config

RULES_YAML = """
limits: {max_body_bytes: 33554432, max_items: 1024}
scorers:
  - {name: len, kind: length, max_queue: 64}
  - {name: em, kind: exact_match}
"""


def metric_counts(text: str) -> dict[tuple[str, str, str], float]:
    out = {}
    for line in text.splitlines():
        m = re.match(r"rewardplane_requests_total\{(.*)\} ([0-9.e+]+)$", line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            out[(labels["route"], labels["status"], labels["code"])] = float(m.group(2))
    return out


def _hostile_bodies() -> list[tuple[str, bytes, int, str]]:
    item = {"id": "a", "response": "x"}

    def nested(depth: int) -> bytes:
        return b'{"scorers":["len"],"items":[{"id":"a","reference":' + b"[" * depth + b"]" * depth + b"}]}"

    return [
        ("5,000-digit integer", b'{"scorers":["len"],"items":[{"id":"a","reference":' + b"9" * 5000 + b"}]}",
         422, "invalid_request"),
        ("float overflowing to inf", b'{"scorers":["len"],"items":[{"id":"a","reference":1e999}]}',
         422, "invalid_request"),
        ("NaN literal", b'{"scorers":["len"],"items":[{"id":"a","reference":NaN}]}', 422, "invalid_request"),
        ("1,000-char scorer name", json.dumps({"scorers": ["x" * 1000], "items": [item]}).encode(),
         422, "invalid_request"),
        ("1,000-char pin", json.dumps({"scorers": ["len"], "items": [item], "pin": {"len": "y" * 1000}}).encode(),
         422, "invalid_request"),
        ("65 scorers", json.dumps({"scorers": ["len"] * 65, "items": [item]}).encode(), 422, "invalid_request"),
        ("513-char id", json.dumps({"scorers": ["len"], "items": [{"id": "i" * 513}]}).encode(),
         422, "invalid_request"),
        ("100-deep reference", nested(100),
         422, "invalid_request"),
        ("100,000-deep reference", nested(100_000),
         422, "invalid_json"),
        ("unknown top-level field", json.dumps({"scorers": ["len"], "items": [item], "x": 1}).encode(),
         422, "invalid_request"),
        ("unknown item field", json.dumps({"scorers": ["len"], "items": [{**item, "x": 1}]}).encode(),
         422, "invalid_request"),
        ("unknown scorer", json.dumps({"scorers": ["nope"], "items": [item]}).encode(), 422, "unknown_scorer"),
        ("not JSON", b"{nope", 422, "invalid_json"),
        ("not UTF-8", b"\xff\xfe\x00", 422, "invalid_json"),
    ]  # fmt: skip


HOSTILE_BODIES = _hostile_bodies()


def test_whole_request_problems_are_4xx_and_every_response_is_counted(tmp_path):
    with served(tmp_path, RULES_YAML) as url, httpx.Client(base_url=url, timeout=30) as client:
        sent: dict[tuple[str, str, str], int] = {}
        before = metric_counts(client.get("/metrics").text)  # the readiness polls of start-up

        def note(route: str, r: httpx.Response) -> None:
            code = r.json().get("code", "") if r.status_code >= 400 else ""
            key = (route, str(r.status_code), code)
            sent[key] = sent.get(key, 0) + 1

        for name, body, status, code in HOSTILE_BODIES:
            r = client.post("/v1/score", content=body, headers={"content-type": "application/json"})
            assert r.status_code == status, (name, r.status_code, r.text[:300])
            err = r.json()
            assert err["code"] == code and isinstance(err["message"], str) and err["message"], name
            assert len(err["message"]) <= 1000, (name, len(err["message"]))
            note("/v1/score", r)
        ok = client.post("/v1/score", json={"scorers": ["len"], "items": [{"id": "a", "response": "xy"}]})
        assert ok.status_code == 200 and ok.json()["results"][0]["scores"]["len"] == 2.0
        note("/v1/score", ok)
        note("unmatched", client.get("/no/such/route"))
        note("/v1/score", client.get("/v1/score"))  # 405
        note("/health/live", client.get("/health/live"))
        note("/health/ready", client.get("/health/ready"))
        note("/v1/scorers", client.get("/v1/scorers"))
        counts = metric_counts(client.get("/metrics").text)
        for key, n in sent.items():
            assert counts.get(key, 0) - before.get(key, 0) == n, (key, n, counts.get(key))
        assert counts[("/metrics", "200", "")] >= 1  # the first scrape, counted after it answered
        assert client.get("/health/ready").status_code == 200


def test_an_unhandled_server_error_is_a_counted_json_500():
    """A 500 (a bug) still answers `{"code","message"}` and is counted: in-process, because a
    real server has no bug to trigger on purpose."""
    with LiveServer(make_config([{"name": "len", "kind": "length"}])) as server:

        def broken() -> dict:
            raise RuntimeError("boom")

        server.backend.scorer_infos = broken  # type: ignore[method-assign]
        r = httpx.post(server.url + "/v1/score", json={"scorers": ["len"], "items": [{"id": "a"}]})
        assert r.status_code == 500 and r.json()["code"] == "internal"
        counts = metric_counts(httpx.get(server.url + "/metrics").text)
        assert counts[("/v1/score", "500", "internal")] == 1


# ------------------------------------------------------------------ 413 too_large, 429 only transient


def test_more_items_than_max_queue_is_413_and_the_client_does_not_retry_it(tmp_path):
    from rewardplane.serve.client import RewardClient, ServiceError

    items = [{"id": str(k), "response": "x"} for k in range(65)]  # `len` has max_queue 64
    with served(tmp_path, RULES_YAML) as url:
        r = httpx.post(url + "/v1/score", json={"scorers": ["len"], "items": items}, timeout=30)
        assert r.status_code == 413 and r.json()["code"] == "too_large", r.text
        assert "retry-after" not in r.headers
        fits = httpx.post(url + "/v1/score", json={"scorers": ["len"], "items": items[:64]}, timeout=30)
        assert fits.status_code == 200
        posts = []

        class Counting(httpx.HTTPTransport):
            def handle_request(self, request: httpx.Request) -> httpx.Response:
                posts.append(request.url.path)
                return super().handle_request(request)

        with (
            RewardClient(url, transport=Counting(), backoff_s=0.01) as client,
            pytest.raises(ServiceError) as err,
        ):
            client.score(items, ["len"])
        assert err.value.status == 413 and err.value.code == "too_large"
        assert posts == ["/v1/score"]  # one attempt: a 413 is final


def test_a_workers_queue_full_keeps_its_retry_after_through_the_deploy_transport(tmp_path):
    import asyncio

    from rewardplane.deploy.transport import RemoteError, TransportClient, serve_unix
    from rewardplane.serve.protocol import ServeError

    async def handler(op, header, body):
        raise ServeError("queue_full", "busy", retry_after=3.0)

    async def go():
        path = str(tmp_path / "w.sock")
        server = await serve_unix(path, handler)
        client = await TransportClient.connect(path)
        try:
            with pytest.raises(RemoteError) as err:
                await client.call("score", {}, timeout=5)
            return err.value
        finally:
            await client.close()
            server.close()

    err = asyncio.run(go())
    assert err.code == "queue_full" and err.retry_after == 3.0


# ------------------------------------------------------------------ a scorer that cannot load: exit 2


def _serve_exit(tmp_path, args: list[str]) -> tuple[int, str]:
    """`rewardplane serve` that must exit by itself: its exit code and output. A hang fails on
    the subprocess's ceiling (a loaded machine's start-up can take minutes: no time is asserted)."""
    import subprocess
    import sys

    from rewardplane.bench.server import free_port

    proc = subprocess.run(
        [sys.executable, "-m", "rewardplane", "serve", *args, "--port", str(free_port())],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return proc.returncode, proc.stderr + proc.stdout


@pytest.mark.parametrize("mode", ["config", "deploy"])
def test_a_scorer_that_cannot_load_exits_2_with_one_line(tmp_path, mode):
    scorers = "scorers:\n  - {name: rm, kind: rm, path: /nonexistent/model}\n  - {name: len, kind: length}\n"
    if mode == "config":
        (tmp_path / "s.yaml").write_text(scorers)
        args = ["--config", "s.yaml"]
    else:
        (tmp_path / "s.yaml").write_text("mode: dedicated\ngpus: []\n" + scorers)
        args = ["--deploy", "s.yaml"]
    code, out = _serve_exit(tmp_path, args)
    assert code == 2, out[-2000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith("rewardplane: error: scorer 'rm' (path /nonexistent/model) failed to load: "), last
    assert "not a directory" in last
    assert "Traceback" not in out
    code, out = _serve_exit(tmp_path, [*args, "--debug"])
    assert code == 2 and "Traceback" in out  # --debug shows where it failed


# ------------------------------------------------------------------ the token: never argv, every /v1/*


def test_token_on_argv_is_refused_with_a_hint(tmp_path):
    (tmp_path / "s.yaml").write_text(RULES_YAML)
    code, out = _serve_exit(tmp_path, ["--config", "s.yaml", "--token", "s3cret"])
    assert code == 2
    last = out.strip().splitlines()[-1]
    assert "REWARDPLANE_TOKEN" in last and "--token-file" in last and "s3cret" not in out, out


@pytest.mark.parametrize("source", ["env", "file"])
def test_with_a_token_every_v1_route_needs_it_and_health_stays_open(tmp_path, source):
    from support.hostile import server_process

    secret = "tok-" + source + "-9f8e7d"
    yaml = tmp_path / "s.yaml"
    yaml.write_text(RULES_YAML)
    if source == "env":
        args, env = ["--config", str(yaml)], {"REWARDPLANE_TOKEN": secret}
    else:
        (tmp_path / "token").write_text(secret + "\n")
        args, env = (
            ["--config", str(yaml), "--token-file", str(tmp_path / "token")],
            {"REWARDPLANE_TOKEN": ""},
        )
    from rewardplane.bench.server import running_server

    with running_server(args, tmp_path, env=env, ready_timeout_s=300) as url:
        assert secret not in " ".join(server_process(url).cmdline())  # nothing in `ps`
        auth = {"authorization": f"Bearer {secret}"}
        body = {"scorers": ["len"], "items": [{"id": "a", "response": "abc"}]}
        for method, path in [("POST", "/v1/score"), ("GET", "/v1/scorers"), ("GET", "/v1/not-a-route-yet"),
                             ("GET", "/metrics")]:  # fmt: skip
            for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": secret}):
                r = httpx.request(
                    method, url + path, json=body if method == "POST" else None, headers=headers
                )
                assert r.status_code == 401 and r.json()["code"] == "unauthorized", (path, headers, r.text)
        assert (
            httpx.post(url + "/v1/score", json=body, headers=auth).json()["results"][0]["scores"]["len"]
            == 3.0
        )
        assert httpx.get(url + "/v1/scorers", headers=auth).status_code == 200
        for path in ("/health/live", "/health/ready", "/openapi.json"):
            assert httpx.get(url + path).status_code == 200, path
        counts = metric_counts(httpx.get(url + "/metrics", headers=auth).text)
        assert counts[("/v1/score", "401", "unauthorized")] == 3  # counted under its route


def test_openapi_describes_every_routes_request_and_response_bodies():
    with LiveServer(make_config([{"name": "len", "kind": "length"}])) as server:
        doc = httpx.get(server.url + "/openapi.json").json()
    schemas = doc["components"]["schemas"]
    body = doc["paths"]["/v1/score"]["post"]["requestBody"]["content"]
    assert body["application/json"]["schema"] == {"$ref": "#/components/schemas/ScoreRequest"}
    assert "request" in body["multipart/form-data"]["schema"]["properties"]
    assert {"ScoreRequest", "ItemIn", "MessageIn", "ImageIn", "ScoreResponse", "ErrorOut"} <= set(schemas)
    assert schemas["ScoreRequest"]["properties"]["items"]["items"] == {"$ref": "#/components/schemas/ItemIn"}

    def refs(node):
        if isinstance(node, dict):
            if "$ref" in node:
                yield node["$ref"]
            for v in node.values():
                yield from refs(v)
        elif isinstance(node, list):
            for v in node:
                yield from refs(v)

    for ref in refs(doc):  # every reference resolves inside the document
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in schemas, ref
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            ok = op["responses"]["200"]
            assert ok.get("content") or ok.get("description"), (path, method)
            if method == "post":
                assert op.get("requestBody"), (path, method)
            for status, resp in op["responses"].items():
                if status.startswith(("4", "5")):
                    assert resp.get("content"), (path, method, status)


# ------------------------------------------------------------------ fairness under a near-limit body


FAIR_YAML = """
limits: {max_body_bytes: 33554432, max_items: 1024, request_timeout_s: 300}
scorers:
  - {name: clip, kind: clip, shape: tiny-clip, device: cpu, max_batch_size: 64, max_wait_ms: 2}
  - {name: len, kind: length}
  - {name: em, kind: exact_match}
"""


def numbers_body(n_items: int = 1024, per_item: int = 5000) -> bytes:
    """A ~29 MiB JSON score request whose items carry thousands of numbers in `metadata`:
    the costliest body to parse and validate per byte."""
    items = [{"id": str(k), "response": "a", "reference": "a", "metadata": {"x": list(range(k, k + per_item))}}
             for k in range(n_items)]  # fmt: skip
    return json.dumps({"scorers": ["em"], "items": items}).encode()


def near_limit_body(target_bytes: int = 29 * 2**20, n_items: int = 1024) -> bytes:
    """A JSON score request of about `target_bytes`: `n_items` distinct noise JPEGs (base64)."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    per_item = target_bytes * 3 // 4 // n_items  # raw JPEG bytes per item
    side, items, size = 96, [], 0
    while True:  # find a side whose noise JPEG is about `per_item` bytes
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(buf, "JPEG", quality=95)
        if buf.tell() >= per_item:
            break
        side += 8
    base = rng.integers(0, 255, (side, side, 3), dtype=np.uint8)
    for k in range(n_items):
        arr = np.roll(base, k, axis=1)
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, "JPEG", quality=95)
        b64 = base64.b64encode(buf.getvalue()).decode()
        size += len(b64)
        items.append({"id": str(k), "prompt": "a photo of noise", "image": {"b64": b64}})
    return json.dumps({"scorers": ["clip"], "items": items}).encode()


@pytest.mark.parametrize("kind", ["images", "numbers"])
def test_health_and_a_small_request_answer_within_1s_during_a_near_limit_body(tmp_path, kind):
    import concurrent.futures
    import time

    body = near_limit_body() if kind == "images" else numbers_body()
    assert 27 * 2**20 < len(body) < 32 * 2**20, len(body)
    with served(tmp_path, FAIR_YAML) as url, httpx.Client(base_url=url, timeout=300) as client:
        small = {"scorers": ["len"], "items": [{"id": "s", "response": "abc"}]}
        assert client.post("/v1/score", json=small).status_code == 200

        def big() -> tuple[float, httpx.Response]:
            started = time.perf_counter()
            with httpx.Client(base_url=url, timeout=300) as c:
                r = c.post("/v1/score", content=body, headers={"content-type": "application/json"})
            return time.perf_counter() - started, r

        live, small_s = [], []
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            fut = pool.submit(big)
            while not fut.done():
                t = time.perf_counter()
                assert client.get("/health/live").status_code == 200
                live.append(time.perf_counter() - t)
                t = time.perf_counter()
                r = client.post("/v1/score", json=small)
                small_s.append(time.perf_counter() - t)
                assert r.status_code == 200 and r.json()["results"][0]["scores"]["len"] == 3.0
                time.sleep(0.05)
            big_s, r = fut.result()
        assert r.status_code == 200, r.text[:300]
        scores = [x["scores"].get("clip" if kind == "images" else "em") for x in r.json()["results"]]
        assert len(scores) == 1024 and all(isinstance(s, float) for s in scores)
        print(
            f"\n{kind}: {len(body) / 2**20:.1f} MiB body, 1024 items, took {big_s:.1f} s; "
            f"{len(live)} probes: /health/live max {max(live) * 1000:.0f} ms, "
            f"small len request max {max(small_s) * 1000:.0f} ms"
        )
        assert len(live) >= 3
        assert max(live) < 1.0 and max(small_s) < 1.0, (max(live), max(small_s))
