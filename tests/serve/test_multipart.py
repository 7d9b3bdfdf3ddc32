"""The in-memory multipart parser: what httpx encodes comes back byte for byte; broken bodies are 422."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import example, given, settings
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


VALID = (
    b'--x\r\nContent-Disposition: form-data; name="a"\r\n\r\nfirst\r\n'
    b'--x\r\nContent-Disposition: form-data; name="b"; filename="b"\r\n\r\n\x00second\r\n--x--\r\n'
)


def mutated(body: bytes):
    """`body` with one byte replaced, one run deleted, or cut short: near-misses of a valid body."""
    return st.one_of(
        st.tuples(st.integers(0, len(body) - 1), st.binary(min_size=1, max_size=1)).map(
            lambda edit: body[: edit[0]] + edit[1] + body[edit[0] + 1 :]
        ),
        st.tuples(st.integers(0, len(body) - 1), st.integers(1, 8)).map(
            lambda cut: body[: cut[0]] + body[cut[0] + cut[1] :]
        ),
        st.integers(0, len(body) - 1).map(lambda end: body[:end]),
    )


def test_the_near_miss_base_body_parses():
    assert parse_multipart(VALID, "multipart/form-data; boundary=x", max_parts=8) == {
        "a": b"first",
        "b": b"\x00second",
    }


@settings(max_examples=80, deadline=None)
@given(raw=st.binary(max_size=300) | mutated(VALID))
@example(raw=b"hello")
@example(raw=b"--x\r\n\r\n--x--")
@example(raw=VALID.replace(b"--x--", b"--y--"))
@example(raw=b"--x\r\nContent-Disposition: form-data;name\r\n\r\n\r\n--x--")  # found by hypothesis
def test_garbage_is_a_serve_error_or_the_parts_it_spells(raw):
    """Garbage is a coded 422, never an exception of another type; a body that parses must end
    with the closing boundary and hold no byte it did not carry (a parser that answered garbage
    with an empty or invented dict fails here)."""
    try:
        parts = parse_multipart(raw, "multipart/form-data; boundary=x", max_parts=8)
    except ServeError as exc:
        assert exc.code in ("invalid_request", "too_many_items")
        return
    assert b"--x--" in raw, (raw, parts)
    assert len(parts) <= 8
    for name, value in parts.items():
        # a name that is not UTF-8 reads with U+FFFD for its bad bytes (never matches a real part)
        spelled = "\ufffd" in name or name.encode() in raw
        assert name and spelled and value in raw, (raw, name, value)
