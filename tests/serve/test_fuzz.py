"""Hypothesis fuzz of POST /v1/score through a live server: any body gives a JSON answer, never a 500."""

from __future__ import annotations

import base64
import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
