"""The HTTP contract through a real uvicorn server: every error code, failure semantics, order."""

from __future__ import annotations

import base64
import concurrent.futures
import json

import httpx
import pytest

from support.serve import DoubleScorer, LiveServer, jpeg_bytes, make_config, png_bytes

TOKEN = "s3cret"
AUTH = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server():
    cfg = make_config(
        [
            {"name": "d", "kind": "double", "max_batch_size": 8, "max_wait_ms": 20},
            {"name": "len", "kind": "length"},
            {"name": "exact", "kind": "exact_match"},
            {"name": "clip", "kind": "clip", "shape": "tiny-clip"},
        ],
        token=TOKEN,
        limits={"max_body_bytes": 200_000, "max_items": 50, "max_image_pixels": 100 * 100},
    )
    with LiveServer(cfg) as s:
        yield s


def post(server, body, headers=AUTH, **kw):
    return httpx.post(server.url + "/v1/score", json=body, headers=headers, timeout=30, **kw)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def assert_error(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == code and isinstance(body["message"], str) and body["message"]
    if r.url.path == "/v1/score":
        assert all(float(r.headers[h]) >= 0 for h in ("x-queue-time", "x-inference-time", "x-total-time"))


def test_scores_keep_order_ids_and_timing_headers(server):
    items = [{"id": f"i{k}", "prompt": "p", "response": "x" * k} for k in range(12)]
    r = post(server, {"scorers": ["d", "len"], "items": items})
    assert r.status_code == 200
    results = r.json()["results"]
    assert [x["id"] for x in results] == [f"i{k}" for k in range(12)]
    assert [x["scores"]["d"] for x in results] == [float(k) for k in range(12)]
    for h in ("x-queue-time", "x-inference-time", "x-total-time"):
        assert float(r.headers[h]) >= 0
    assert r.json()["scorers"]["d"] == {"version": "test", "identity": "ident-d"}


def test_non_finite_and_failures_are_per_item_never_numbers(server):
    items = [
        {"id": "ok", "response": "fine"},
        {"id": "nan", "response": "NAN"},
        {"id": "inf", "response": "INF"},
        {"id": "str", "response": "STR"},
        {"id": "err", "response": "ERR"},
    ]
    r = post(server, {"scorers": ["d", "len"], "items": items})
    assert r.status_code == 200
    res = {x["id"]: x for x in r.json()["results"]}
    assert res["ok"]["scores"] == {"d": 4.0, "len": 4.0} and res["ok"]["errors"] == {}
    for bad, code in (
        ("nan", "non_finite"),
        ("inf", "non_finite"),
        ("str", "scorer_failed"),
        ("err", "bad_image"),
    ):
        assert "d" not in res[bad]["scores"]
        assert res[bad]["errors"]["d"]["code"] == code
        assert res[bad]["scores"]["len"] == 3.0  # the other scorer is unaffected


def test_exception_fails_that_batch_only_for_that_scorer(server):
    r = post(server, {"scorers": ["d", "len"], "items": [{"id": "a", "response": "RAISE"}]})
    assert r.status_code == 200
    (res,) = r.json()["results"]
    assert res["errors"]["d"]["code"] == "scorer_failed" and res["scores"] == {"len": 5.0}


def test_exact_match_needs_reference(server):
    items = [{"id": "a", "response": " Paris ", "reference": "paris"}, {"id": "b", "response": "Paris"}]
    res = post(server, {"scorers": ["exact"], "items": items}).json()["results"]
    assert res[0]["scores"] == {"exact": 1.0}
    assert res[1]["errors"]["exact"]["code"] == "missing_reference"


UNAUTHORIZED = {
    "code": "unauthorized",
    "message": "missing or wrong bearer token (Authorization: Bearer <token>)",
}
OPEN = {"/health/live", "/health/ready", "/health"}  # the probes (app.OPEN_ROUTES)


def test_unauthorized(server):
    assert_error(post(server, {"scorers": ["d"], "items": []}, headers={}), 401, "unauthorized")
    wrong = post(server, {"scorers": ["d"], "items": []}, headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json() == UNAUTHORIZED
    metrics = httpx.get(server.url + "/metrics")
    assert metrics.status_code == 401 and metrics.json() == UNAUTHORIZED
    assert httpx.get(server.url + "/health/live").json() == {"status": "ok"}


def test_one_auth_mechanism_guards_every_route_but_the_probes(server):
    """Every route the OpenAPI document lists (the trainer protocols' too) refuses a request
    without the token and takes one with it; only the probes are open. POSTs carry a malformed
    body, so an accepted one is refused for its body and changes nothing."""
    doc = httpx.get(server.url + "/openapi.json").json()
    routes = [(m.upper(), path) for path, ops in doc["paths"].items() for m in ops]
    assert {("POST", "/score"), ("GET", "/rewards"), ("POST", "/get_reward"), ("POST", "/v1/score"),
            ("GET", "/metrics"), ("GET", "/v1/lifecycle"), ("POST", "/v1/lifecycle/offload")} <= set(routes)  # fmt: skip
    assert {path for _, path in routes} >= OPEN
    for method, path in routes:
        kwargs = {"content": b"{"} if method == "POST" else {}
        refused = httpx.request(method, server.url + path, timeout=30, **kwargs)
        taken = httpx.request(method, server.url + path, headers=AUTH, timeout=30, **kwargs)
        if path in OPEN:
            assert refused.status_code == taken.status_code == 200, (path, refused.text)
            continue
        assert refused.status_code == 401 and refused.json() == UNAUTHORIZED, (method, path, refused.text)
        assert taken.status_code != 401, (method, path, taken.text)
        if method == "GET" and path == "/v1/audit":  # this service has no `audit:` section
            assert taken.status_code == 404 and taken.json()["code"] == "not_found", taken.text
        elif method == "GET":
            assert taken.status_code == 200, (path, taken.text)
        else:
            assert 400 <= taken.status_code < 500 and taken.json()["code"] != "unauthorized", (
                path,
                taken.text,
            )


def test_identity_pin(server):
    ok = post(server, {"scorers": ["d"], "items": [{"id": "a"}], "pin": {"d": "ident-d"}})
    assert ok.status_code == 200
    assert_error(
        post(server, {"scorers": ["d"], "items": [{"id": "a"}], "pin": {"d": "other"}}),
        409,
        "identity_mismatch",
    )
    assert_error(post(server, {"scorers": ["d"], "items": [], "pin": {"len": "x"}}), 422, "invalid_request")


def test_size_limits(server):
    huge = {"scorers": ["d"], "items": [{"id": "a", "response": "x" * 300_000}]}
    assert_error(post(server, huge), 413, "body_too_large")
    # a streamed body without Content-Length is cut off as well
    chunks = (b"x" * 50_000 for _ in range(10))
    r = httpx.post(
        server.url + "/v1/score", content=chunks, headers={**AUTH, "content-type": "application/json"}
    )
    assert_error(r, 413, "body_too_large")
    many = {"scorers": ["d"], "items": [{"id": str(k)} for k in range(51)]}
    assert_error(post(server, many), 413, "too_many_items")
    big = {
        "scorers": ["clip"],
        "items": [
            {"id": "a", "prompt": "x", "image": {"b64": b64(png_bytes((101, 100)))}},
            {"id": "b", "prompt": "x", "image": {"b64": b64(png_bytes((100, 100)))}},
        ],
    }
    r = post(server, big)  # over max_image_pixels: that item's bad_input, refused without decoding
    assert r.status_code == 200, r.text
    over, ok = r.json()["results"]
    assert (
        over["errors"]["clip"]["code"] == "bad_input"
        and "max_image_pixels" in over["errors"]["clip"]["message"]
    )
    assert isinstance(ok["scores"]["clip"], float)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", "invalid_json"),
        (b"\xff\xfe", "invalid_json"),
        (b"[]", "invalid_request"),
        (json.dumps({"scorers": "d", "items": []}).encode(), "invalid_request"),
        (json.dumps({"scorers": ["d"], "items": [{"id": 5}]}).encode(), "invalid_request"),
        (json.dumps({"scorers": ["d"], "items": [{"id": "a", "response": 3.5}]}).encode(), "invalid_request"),
        (json.dumps({"scorers": ["d"], "items": [{"id": "a", "extra": 1}]}).encode(), "invalid_request"),
        (json.dumps({"scorers": [], "items": []}).encode(), "invalid_request"),
        (json.dumps({"scorers": ["d"], "items": [{"id": "a"}, {"id": "a"}]}).encode(), "invalid_request"),
        (
            json.dumps({"scorers": ["d"], "items": [{"id": "a", "response": [{"role": "x"}]}]}).encode(),
            "invalid_request",
        ),
        (json.dumps({"scorers": ["nope"], "items": []}).encode(), "unknown_scorer"),
    ],
)
def test_schema_errors_are_422(server, body, code):
    r = httpx.post(
        server.url + "/v1/score", content=body, headers={**AUTH, "content-type": "application/json"}
    )
    assert_error(r, 422, code)


def test_image_errors(server):
    def one(image):
        return post(server, {"scorers": ["clip"], "items": [{"id": "a", "prompt": "a cat", "image": image}]})

    assert_error(one({"b64": "!!!not base64"}), 422, "bad_image")  # the wire encoding itself
    for data in (b"definitely not an image", jpeg_bytes()[:-40], png_bytes()[:-30], b""):
        r = one({"b64": b64(data)})  # the image: that item's bad_input (tests/serve/test_images.py)
        assert r.status_code == 200, r.text
        assert r.json()["results"][0]["errors"]["clip"]["code"] == "bad_input"
    assert_error(one({"b64": "aa", "part": "x"}), 422, "invalid_request")
    assert_error(
        post(server, {"scorers": ["clip"], "items": [{"id": "a", "prompt": "x"}]}), 422, "missing_image"
    )
    ok = one({"b64": b64(jpeg_bytes())})
    assert ok.status_code == 200 and isinstance(ok.json()["results"][0]["scores"]["clip"], float)


def test_multipart_images_match_base64(server):
    jpg, png = jpeg_bytes(), png_bytes()
    request = {
        "scorers": ["clip"],
        "items": [
            {"id": "j", "prompt": "a cat", "image": {"part": "img0"}},
            {"id": "p", "prompt": "a dog", "image": {"part": "img1"}},
        ],
    }
    files = [
        ("request", (None, json.dumps(request), "application/json")),
        ("img0", ("a.jpg", jpg, "image/jpeg")),
        ("img1", ("b.png", png, "image/png")),
    ]
    r = httpx.post(server.url + "/v1/score", files=files, headers=AUTH)
    assert r.status_code == 200, r.text
    via_b64 = post(
        server,
        {
            "scorers": ["clip"],
            "items": [
                {"id": "j", "prompt": "a cat", "image": {"b64": b64(jpg)}},
                {"id": "p", "prompt": "a dog", "image": {"b64": b64(png)}},
            ],
        },
    ).json()
    assert r.json()["results"] == via_b64["results"]
    missing = httpx.post(server.url + "/v1/score", files=files[1:], headers=AUTH)
    assert_error(missing, 422, "invalid_request")
    bad_part = {**request, "items": [{"id": "j", "prompt": "x", "image": {"part": "zzz"}}]}
    r = httpx.post(
        server.url + "/v1/score",
        files=[("request", (None, json.dumps(bad_part), "application/json"))],
        headers=AUTH,
    )
    assert_error(r, 422, "invalid_request")


def test_many_concurrent_clients_keep_ids_and_order(server):
    DoubleBatches = DoubleScorer.batches
    DoubleBatches.clear()

    def client(c: int) -> None:
        items = [{"id": f"c{c}-{k}", "response": "y" * ((c * 7 + k) % 13)} for k in range(5)]
        r = post(server, {"scorers": ["d"], "items": items})
        assert r.status_code == 200
        res = r.json()["results"]
        assert [x["id"] for x in res] == [i["id"] for i in items]
        assert [x["scores"]["d"] for x in res] == [float(len(i["response"])) for i in items]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(client, range(40)))
    # items from different requests shared batches (5 items per request, batches up to 8)
    assert max(DoubleBatches) > 5


def test_scorers_health_metrics_openapi(server):
    info = httpx.get(server.url + "/v1/scorers", headers=AUTH).json()
    by_name = {s["name"]: s for s in info["scorers"]}
    assert set(by_name) == {"d", "len", "exact", "clip"}
    clip = by_name["clip"]
    assert clip["modality"] == "image_text" and clip["dtype"] == "fp32" and len(clip["identity"]) == 64
    assert clip["max_batch_size"] == 32
    assert httpx.get(server.url + "/health/ready").json()["ready"] is True
    post(server, {"scorers": ["d"], "items": [{"id": "n", "response": "NAN"}]})
    text = httpx.get(server.url + "/metrics", headers=AUTH).text
    for name in (
        "rewardplane_requests_total",
        "rewardplane_items_total",
        "rewardplane_batch_size_bucket",
        "rewardplane_queue_delay_seconds_bucket",
        "rewardplane_request_latency_seconds_bucket",
        "rewardplane_queue_depth",
        "rewardplane_non_finite_total",
    ):
        assert name in text
    assert 'rewardplane_non_finite_total{scorer="d"}' in text
    assert "/v1/score" in httpx.get(server.url + "/openapi.json").json()["paths"]
    assert_error(httpx.get(server.url + "/nope", headers=AUTH), 404, "not_found")
    assert_error(httpx.get(server.url + "/nope"), 401, "unauthorized")  # no route says what exists


def test_queue_full_429_and_queue_timeout_504():
    cfg = make_config(
        [
            {
                "name": "slow",
                "kind": "double",
                "max_batch_size": 1,
                "max_wait_ms": 0,
                "max_queue": 2,
                "options": {"sleep_s": 0.4},
            }
        ],
        limits={"queue_timeout_s": 0.3},
    )
    with LiveServer(cfg) as s:

        def one(k: int) -> httpx.Response:
            return httpx.post(
                s.url + "/v1/score",
                json={"scorers": ["slow"], "items": [{"id": str(k), "response": "x"}]},
                timeout=30,
            )

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(one, range(8)))
        codes = sorted(r.status_code for r in responses)
        assert 200 in codes and 429 in codes and 504 in codes, codes
        for r in responses:
            if r.status_code == 429:
                assert_error(r, 429, "queue_full")
                assert int(r.headers["retry-after"]) >= 1
            elif r.status_code == 504:
                assert_error(r, 504, "queue_timeout")
        big = httpx.post(
            s.url + "/v1/score", json={"scorers": ["slow"], "items": [{"id": "a"}, {"id": "b"}, {"id": "c"}]}
        )
        assert_error(big, 413, "too_large")  # more than max_queue: no retry can ever fit it
        assert "retry-after" not in big.headers


def test_not_ready_503_when_warmup_is_not_finite():
    cfg = make_config(
        [
            {"name": "ok", "kind": "length"},
            {"name": "bad", "kind": "double", "options": {"fail_warmup": True}},
        ]
    )
    with LiveServer(cfg, wait_ready=False) as s:
        import time

        deadline = time.monotonic() + 120
        while (
            httpx.get(s.url + "/v1/scorers").json()["status"]["ok"] != "ready" and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        r = httpx.get(s.url + "/health/ready")
        assert_error(r, 503, "not_ready")
        assert r.json()["scorers"]["bad"].startswith("failed")
        assert_error(
            httpx.post(s.url + "/v1/score", json={"scorers": ["bad"], "items": [{"id": "a"}]}),
            503,
            "not_ready",
        )
        ok = httpx.post(
            s.url + "/v1/score", json={"scorers": ["ok"], "items": [{"id": "a", "response": "ab"}]}
        )
        assert ok.json()["results"][0]["scores"] == {"ok": 2.0}


def test_ready_turns_503_when_a_scorer_breaks():
    cfg = make_config([{"name": "d", "kind": "double", "max_batch_size": 1}])
    with LiveServer(cfg) as s:
        for k in range(3):
            r = httpx.post(
                s.url + "/v1/score", json={"scorers": ["d"], "items": [{"id": str(k), "response": "RAISE"}]}
            )
            assert r.json()["results"][0]["errors"]["d"]["code"] == "scorer_failed"
        assert_error(httpx.get(s.url + "/health/ready"), 503, "not_ready")
        httpx.post(s.url + "/v1/score", json={"scorers": ["d"], "items": [{"id": "x", "response": "ok"}]})
        assert httpx.get(s.url + "/health/ready").status_code == 200
