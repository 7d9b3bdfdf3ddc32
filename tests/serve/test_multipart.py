"""The in-memory multipart parser: what httpx encodes comes back byte for byte; broken bodies are 422."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardplane.serve.multipart import parse_multipart
from rewardplane.serve.protocol import ServeError


def encode(files: list[tuple[str, tuple]]) -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://x/v1/score", files=files)
    return request.read(), request.headers["content-type"]


def code_of(body: bytes, content_type: str, max_parts: int = 16) -> str:
    with pytest.raises(ServeError) as info:
        parse_multipart(body, content_type, max_parts=max_parts)
    return info.value.code


@settings(max_examples=60, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=3000), min_size=1, max_size=6),
    json_text=st.text(max_size=200),
)
def test_round_trip_of_fields_and_binary_files(payloads, json_text):
    files = [("request", (None, json_text, "application/json"))]
    files += [(f"img{i}", (f"{i}.bin", data, "application/octet-stream")) for i, data in enumerate(payloads)]
    body, content_type = encode(files)
    parts = parse_multipart(body, content_type, max_parts=16)
    assert parts == {"request": json_text.encode(), **{f"img{i}": d for i, d in enumerate(payloads)}}


def test_parts_that_look_like_boundaries_survive():
    body, content_type = encode([("a", ("a", b"\r\n--\r\n--x\r\n\r\n", "application/octet-stream"))])
    assert parse_multipart(body, content_type, max_parts=4) == {"a": b"\r\n--\r\n--x\r\n\r\n"}


def test_truncated_body_is_an_error_not_a_shorter_request():
    body, content_type = encode(
        [("a", ("a", b"x" * 100, "image/jpeg")), ("b", ("b", b"y" * 100, "image/jpeg"))]
    )
    assert body.endswith(b"--\r\n")  # the closing boundary, then an optional CRLF
    for cut in (len(body) - 4, len(body) - 60, len(body) // 2, 10):
        assert code_of(body[:cut], content_type) == "invalid_request"


def test_missing_boundary_duplicate_name_and_no_name():
    body, content_type = encode([("a", ("a", b"1", "text/plain"))])
    assert code_of(body, "multipart/form-data") == "invalid_request"
    dup, dup_type = encode([("a", ("a", b"1", "text/plain")), ("a", ("a", b"2", "text/plain"))])
    assert code_of(dup, dup_type) == "invalid_request"
    nameless = body.replace(b'name="a"; ', b"")
    assert b"; name=" not in nameless
    assert code_of(nameless, content_type) == "invalid_request"


def test_part_count_is_bounded():
    body, content_type = encode([(f"p{i}", (f"{i}", b"z", "text/plain")) for i in range(5)])
    assert len(parse_multipart(body, content_type, max_parts=5)) == 5
    assert code_of(body, content_type, max_parts=4) == "too_many_items"


@settings(max_examples=80, deadline=None)
@given(raw=st.binary(max_size=300))
def test_garbage_is_a_serve_error(raw):
    try:
        parse_multipart(raw, "multipart/form-data; boundary=x", max_parts=8)
    except ServeError as exc:
        assert exc.code in ("invalid_request", "too_many_items")
