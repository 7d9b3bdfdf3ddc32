import json

import pytest

from rewardplane.bench.loadgen import REASONS, ScoreBook, validate_response

IDS, SCORERS = ["x", "y"], ["a", "b"]


def body(results):
    return json.dumps({"results": results, "scorers": {}}, allow_nan=True).encode()


def good(item_id, a=0.5, b=-1.0):
    return {"id": item_id, "scores": {"a": a, "b": b}, "errors": {}}


def test_valid_response_gives_scores():
    reasons, valid, errors = validate_response(200, body([good("x"), good("y", 2, 3)]), IDS, SCORERS)
    assert reasons == [] and not errors
    assert valid == {"x": {"a": 0.5, "b": -1.0}, "y": {"a": 2.0, "b": 3.0}}


@pytest.mark.parametrize(
    ("status", "payload", "expected"),
    [
        (503, b'{"code": "overloaded"}', ["http_503"]),
        (200, b"<html>", ["invalid_json"]),
        (200, b'{"items": []}', ["invalid_body"]),
        (200, body([good("x")]), ["missing_id"]),
        (200, body([good("x"), good("y"), good("z")]), ["extra_id"]),
        (200, body([good("x"), good("x"), good("y")]), ["duplicate_id"]),
        (200, body([good("y"), good("x")]), ["order_mismatch"]),
        (200, body([good("x"), {"id": "y", "scores": {"a": 1.0}, "errors": {}}]), ["missing_scorer"]),
        (200, body([good("x"), {"id": "y", "scores": {"a": 1.0, "b": 1.0, "c": 1.0}}]), ["extra_scorer"]),
        (200, body([good("x", a=None), good("y")]), ["score_none"]),
        (200, body([good("x", a=True), good("y")]), ["score_bool"]),
        (200, body([good("x", a="0.5"), good("y", b=[1])]), ["score_non_numeric"]),
        (200, body([good("x", a=float("nan")), good("y", b=float("-inf"))]), ["score_non_finite"]),
        (200, body([good("x", a=float("inf")), {"id": "y"}]), ["missing_scorer", "score_non_finite"]),
        (200, body([good("x"), "y"]), ["invalid_body", "missing_id"]),
    ],
)
def test_failures_have_reasons(status, payload, expected):
    reasons, _, _ = validate_response(status, payload, IDS, SCORERS)
    assert reasons == expected
    assert all(r in REASONS or r.startswith("http_") for r in reasons)


def test_service_reported_errors_are_counted_by_code_and_never_scores():
    result = {"id": "y", "scores": {"a": 1.0}, "errors": {"b": {"code": "non_finite", "message": "NaN"}}}
    reasons, valid, errors = validate_response(200, body([good("x"), result]), IDS, SCORERS)
    assert reasons == ["scorer_error"]
    assert errors == {"non_finite": 1}
    assert valid["y"] == {"a": 1.0}  # the valid score is kept, the failed one is not invented


def test_integers_are_numbers_booleans_are_not():
    reasons, valid, _ = validate_response(200, body([good("x", a=1, b=0), good("y")]), IDS, SCORERS)
    assert reasons == [] and valid["x"] == {"a": 1.0, "b": 0.0}


def test_score_book_keeps_first_value_and_spread():
    book = ScoreBook()
    book.add("x", "a", 1.0)
    book.add("x", "a", 1.25)
    book.add("x", "a", 0.9)
    book.add("y", "b", 2.0)
    assert book.scores == {"x": {"a": 1.0}, "y": {"b": 2.0}}
    assert book.spread == {"a": 0.25, "b": 0.0}
