"""Hypothesis fuzz of POST /v1/score through a live server: any body gives a JSON answer, never a 500."""

from __future__ import annotations

import base64
import io
import json
import math
import re

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.hostile import hostile_images, served
from support.serve import LiveServer, make_config


@pytest.fixture(scope="module")
def server():
    cfg = make_config(
        [
            {"name": "d", "kind": "double"},
            {"name": "len", "kind": "length"},
            {"name": "em", "kind": "exact_match"},
        ],
        limits={"max_items": 20, "max_body_bytes": 20_000},
    )
    with LiveServer(cfg) as s, httpx.Client(base_url=s.url, timeout=30) as client:
        yield client


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
text_or_messages = (
    st.text(max_size=30)
    | st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "assistant", "x"]), "content": st.text(max_size=20)}
        ),
        max_size=3,
    )
    | json_values
)
image = (
    st.none()
    | st.fixed_dictionaries({"b64": st.text(max_size=40)})
    | st.fixed_dictionaries({"b64": st.binary(max_size=60).map(lambda b: base64.b64encode(b).decode())})
    | json_values
)
item = st.fixed_dictionaries(
    {"id": st.text(max_size=10) | json_values},
    optional={
        "prompt": text_or_messages,
        "response": text_or_messages,
        "image": image,
        "reference": st.none() | st.text(max_size=10),
    },
)
request = st.fixed_dictionaries(
    {
        "scorers": st.lists(st.sampled_from(["d", "len", "em", "nope"]), max_size=3) | json_values,
        "items": st.lists(item, max_size=25) | json_values,
    },
    optional={"pin": st.dictionaries(st.sampled_from(["d", "len"]), st.text(max_size=5)) | json_values},
)


def check(r: httpx.Response) -> None:
    assert r.status_code != 500 and r.status_code < 600, r.text
    body = r.json()
    if r.status_code != 200:
        assert set(body) >= {"code", "message"}
    else:
        for res in body["results"]:
            for value in res["scores"].values():
                assert isinstance(value, float)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=request)
def test_structured_requests_never_500(server, body):
    check(server.post("/v1/score", content=json.dumps(body), headers={"content-type": "application/json"}))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    raw=st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()),
    content_type=st.sampled_from(
        ["application/json", "text/plain", "multipart/form-data; boundary=x", "multipart/form-data"]
    ),
)
def test_arbitrary_bytes_never_500(server, raw, content_type):
    check(server.post("/v1/score", content=raw, headers={"content-type": content_type}))


# ---------------------------------------------------------------------------------------------
# Through a real `rewardplane serve` process (issue 23): multipart bodies, hostile images, hostile
# scalars and nesting. Every answer is checked against an oracle: a 5xx or a score that should
# not exist (a "fabricated" score) is counted and fails the run; docs/reliability.md records the
# counts. Bounded for CI: a few hundred examples, each request well under a second.


REAL_YAML = """
limits: {max_items: 20, max_body_bytes: 400000}
scorers:
  - {name: len, kind: length, max_queue: 16}
  - {name: em, kind: exact_match}
  - {name: clip, kind: clip, shape: tiny-clip, device: cpu, max_wait_ms: 1}
"""
IMAGES = [(name, data, want) for name, data, want in hostile_images() if len(data) < 100_000]
STATS = {
    "requests": 0,
    "5xx": 0,
    "fabricated": 0,
    "scores": 0,
    "item_errors": 0,
    "by_status": {},
    "by_code": {},
}


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    with (
        served(tmp_path_factory.mktemp("fuzz"), REAL_YAML) as url,
        httpx.Client(base_url=url, timeout=30) as c,
    ):
        yield c


def _fabricated(item: dict, scorer: str, value: object, image_want: str | None) -> bool:
    """A score that must not exist: not a finite float, a clip score for a refused image, a
    `len` that is not the response's length, an `em` that is not 0/1."""
    if not isinstance(value, float) or not math.isfinite(value):
        return True
    if scorer == "clip":
        return image_want != "score"
    if scorer == "len":
        response = item.get("response", "")
        return isinstance(response, str) and value != float(len(response))
    if scorer == "em":
        return value not in (0.0, 1.0)
    return False


def real_check(r: httpx.Response, sent: dict | None = None, wants: dict[str, str] | None = None) -> None:
    STATS["requests"] += 1
    STATS["by_status"][r.status_code] = STATS["by_status"].get(r.status_code, 0) + 1
    if r.status_code >= 500:
        STATS["5xx"] += 1
    assert r.status_code < 500, r.text[:300]
    body = r.json()
    if r.status_code != 200:
        assert set(body) >= {"code", "message"} and isinstance(body["code"], str)
        STATS["by_code"][body["code"]] = STATS["by_code"].get(body["code"], 0) + 1
        return
    items = {i.get("id"): i for i in (sent or {}).get("items", []) if isinstance(i, dict)}
    for res in body["results"]:
        assert not set(res["scores"]) & set(res["errors"])  # never both
        STATS["scores"] += len(res["scores"])
        STATS["item_errors"] += len(res["errors"])
        for scorer, value in res["scores"].items():
            want = (wants or {}).get(res["id"])
            if _fabricated(items.get(res["id"], {}), scorer, value, want):
                STATS["fabricated"] += 1
                raise AssertionError(f"fabricated score {scorer}={value!r} for {res['id']}: {r.text[:300]}")


def _multipart(parts: list[tuple[str, bytes, str | None]], boundary: str = "rkfuzzboundary") -> bytes:
    out = io.BytesIO()
    for name, data, filename in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out.write(f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + data + b"\r\n")
    out.write(f"--{boundary}--\r\n".encode())
    return out.getvalue()


image_case = st.sampled_from(range(len(IMAGES)))
hostile_scalar = st.sampled_from(
    [
        "9" * 5000,  # over Python's int digit limit
        "1e999",
        "-1e999",
        "NaN",
        "Infinity",
        '"' + "x" * 5000 + '"',
        "[" * 70 + "]" * 70,
        '{"a":' * 70 + "1" + "}" * 70,
        '"\\ud800"',
        "123456789012345678901234567890",
    ]
)


@st.composite
def image_request(draw):
    """Items whose images come from the hostile corpus, as base64 or as multipart parts."""
    n = draw(st.integers(1, 4))
    scorers = draw(st.lists(st.sampled_from(["clip", "len", "em"]), min_size=1, max_size=3, unique=True))
    if draw(st.integers(0, 9)) == 0:
        scorers.append("nope")  # now and then a whole-request error
    items, parts, wants = [], [], {}
    for k in range(n):
        name, data, want = IMAGES[draw(image_case)]
        item = {"id": f"i{k}", "prompt": "a cat", "response": draw(st.text(max_size=8)), "reference": "a"}
        if draw(st.booleans()):
            item["image"] = {"part": f"p{k}"}
            parts.append((f"p{k}", data, f"p{k}.bin"))
        else:
            item["image"] = {"b64": base64.b64encode(data).decode()}
        items.append(item)
        wants[f"i{k}"] = want
    return {"scorers": scorers, "items": items}, parts, wants


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=image_request(), as_multipart=st.booleans())
def test_real_server_hostile_images_json_and_multipart(real, case, as_multipart):
    payload, parts, wants = case
    if parts or as_multipart:
        body = _multipart([("request", json.dumps(payload).encode(), None), *parts])
        r = real.post(
            "/v1/score",
            content=body,
            headers={"content-type": "multipart/form-data; boundary=rkfuzzboundary"},
        )
    else:
        r = real.post("/v1/score", content=json.dumps(payload), headers={"content-type": "application/json"})
    real_check(r, payload, wants)
    if r.status_code == 200 and "clip" in payload["scorers"]:
        for res in r.json()["results"]:
            if wants[res["id"]] == "bad_input":
                assert res["errors"]["clip"]["code"] == "bad_input", res


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    parts=st.lists(
        st.tuples(
            st.sampled_from(["request", "img0", "img1", "", 'a"b', "é"]) | st.text(max_size=6),
            st.binary(max_size=80)
            | st.sampled_from(
                [
                    json.dumps(
                        {
                            "scorers": ["len"],
                            "items": [{"id": "a", "response": "xy", "image": {"part": "img0"}}],
                        }
                    ).encode()
                ]
            ),
            st.none() | st.just("f.bin"),
        ),
        max_size=4,
    ),
    cut=st.none() | st.integers(0, 400),
    boundary=st.sampled_from(["rkfuzzboundary", "other", ""]),
)
def test_real_server_multipart_never_500(real, parts, cut, boundary):
    body = _multipart(parts)
    if cut is not None:
        body = body[:cut]
    content_type = "multipart/form-data" + (f"; boundary={boundary}" if boundary else "")
    r = real.post("/v1/score", content=body, headers={"content-type": content_type})
    real_check(r, {"items": [{"id": "a", "response": "xy"}]})


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    scalar=hostile_scalar,
    where=st.sampled_from(["reference", "metadata", "id", "response", "scorers", "pin", "top"]),
)
def test_real_server_hostile_scalars_and_nesting(real, scalar, where):
    templates = {
        "reference": '{"scorers":["len","em"],"items":[{"id":"a","response":"xyz","reference":@}]}',
        "metadata": '{"scorers":["len"],"items":[{"id":"a","response":"xyz","metadata":{"k":@}}]}',
        "id": '{"scorers":["len"],"items":[{"id":@,"response":"xyz"}]}',
        "response": '{"scorers":["len"],"items":[{"id":"a","response":@}]}',
        "scorers": '{"scorers":[@],"items":[{"id":"a","response":"xyz"}]}',
        "pin": '{"scorers":["len"],"items":[{"id":"a","response":"xyz"}],"pin":{"len":@}}',
        "top": '{"scorers":["len"],"items":[{"id":"a","response":"xyz"}],"extra":@}',
    }
    raw = templates[where].replace("@", scalar)
    r = real.post("/v1/score", content=raw.encode(), headers={"content-type": "application/json"})
    sent = json.loads(raw) if r.status_code == 200 else None
    real_check(r, sent)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=request)
def test_real_server_structured_requests(real, body):
    body = json.loads(json.dumps(body).replace('"d"', '"len"'))  # the real server's scorers
    r = real.post("/v1/score", content=json.dumps(body), headers={"content-type": "application/json"})
    real_check(r, body if isinstance(body.get("items"), list) else None)


def _finite_numbers(node: object) -> bool:
    if isinstance(node, float):
        return math.isfinite(node)
    if isinstance(node, dict):
        return all(_finite_numbers(v) for v in node.values())
    if isinstance(node, list):
        return all(_finite_numbers(v) for v in node)
    return True


def trainer_check(r: httpx.Response, sent_texts: list[str] | None) -> None:
    """The trainer routes: never a 5xx; a 200 carries only finite numbers, and `len` scores
    (the only scorer these fuzz cases can reach with text) equal the scored text's length."""
    STATS["requests"] += 1
    STATS["by_status"][r.status_code] = STATS["by_status"].get(r.status_code, 0) + 1
    if r.status_code >= 500:
        STATS["5xx"] += 1
    assert r.status_code < 500, r.text[:300]
    body = r.json()
    if r.status_code != 200:
        code = body.get("code") if isinstance(body, dict) else None
        STATS["by_code"][str(code)] = STATS["by_code"].get(str(code), 0) + 1
        return
    if not _finite_numbers(body):
        STATS["fabricated"] += 1
        raise AssertionError(f"non-finite number in a 200: {r.text[:300]}")
    if sent_texts is not None and isinstance(body, dict) and "scores" in body:  # /get_reward ?scorer=len
        STATS["scores"] += len(body["scores"])
        if body["scores"] != [float(len(t)) for t in sent_texts]:
            STATS["fabricated"] += 1
            raise AssertionError(f"/get_reward scores {body['scores']} for {sent_texts}")


text_list = st.lists(st.text(max_size=12), max_size=4)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.fixed_dictionaries(
        {"query": text_list}, optional={"prompts": text_list, "labels": st.lists(json_values, max_size=4)}
    )
    | json_values,
    scorer=st.sampled_from(["len", "em", "clip", "nope", None]),
    mode=st.sampled_from(["raw", "split", "bogus"]),
)
def test_real_server_openrlhf_route(real, body, scorer, mode):
    params = {"mode": mode, **({"scorer": scorer} if scorer else {})}
    r = real.post(
        "/get_reward", content=json.dumps(body), params=params, headers={"content-type": "application/json"}
    )
    texts = body.get("query") if scorer == "len" and mode == "raw" and isinstance(body, dict) else None
    trainer_check(r, texts)


unirl_turn = st.fixed_dictionaries(
    {}, optional={"text": st.text(max_size=10) | json_values, "image_b64": st.sampled_from(
        ["", "!!", base64.b64encode(IMAGES[0][1]).decode(), base64.b64encode(IMAGES[-1][1]).decode()]) | json_values}
)  # fmt: skip
unirl_request = st.fixed_dictionaries(
    {
        "history": st.lists(unirl_turn, max_size=3) | json_values,
        "required_rewards": st.lists(st.sampled_from(["len", "em", "clip", "nope"]), max_size=3)
        | json_values,
    },
    optional={
        "metadata": st.dictionaries(st.sampled_from(["reference", "answer", "x"]), json_values, max_size=2),
        "request_id": st.text(max_size=5) | st.integers(),
        "scorer_version": st.text(max_size=5),
        "idempotency_key": st.text(max_size=6),
    },
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.fixed_dictionaries(
        {"requests": st.lists(unirl_request, max_size=3) | json_values},
        optional={
            "protocol_version": st.sampled_from(["1", "2", 1]),
            "grad_mode": st.booleans() | json_values,
        },
    )
    | json_values
)
def test_real_server_unirl_route(real, body):
    r = real.post("/score", content=json.dumps(body), headers={"content-type": "application/json"})
    trainer_check(r, None)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    action=st.sampled_from(["offload", "onload", "drain", "bogus"]),
    body=st.fixed_dictionaries(
        {},
        optional={
            "scorers": st.lists(st.sampled_from(["nope", "", "x" * 200]), min_size=1, max_size=2)
            | json_values,
            "timeout_s": json_values,
        },  # fmt: skip
    )
    | json_values,
)
def test_real_server_lifecycle_routes_refuse_bad_bodies(real, action, body):
    """Only bodies that cannot name a hosted scorer: the fuzz must not offload or drain the server
    the other fuzz tests score on (docs/lifecycle.md tests the real transitions)."""
    if isinstance(body, dict | list) and (body == {} or "scorers" not in body or body.get("scorers") is None):
        body = {"scorers": ["nope"], **(body if isinstance(body, dict) else {})}
        body["scorers"] = ["nope"]
    r = real.post(
        f"/v1/lifecycle/{action}", content=json.dumps(body), headers={"content-type": "application/json"}
    )
    trainer_check(r, None)
    assert real.get("/health/ready").status_code == 200


def test_real_server_fuzz_counts(real):
    """Runs after the fuzz tests above (file order): no 5xx, no fabricated score, metrics agree."""
    text = real.get("/metrics").text
    # (the start-up readiness polls answered 503 before the scorers loaded: not fuzz answers)
    five = re.compile(r'rewardplane_requests_total\{.*status="5')
    fives = [line for line in text.splitlines() if five.match(line) and 'route="/health/ready"' not in line]
    print(f"\nreal-server fuzz: {STATS}")
    assert STATS["requests"] >= 300 and STATS["5xx"] == 0 and STATS["fabricated"] == 0, STATS
    assert not fives, fives
    assert real.get("/health/ready").status_code == 200
