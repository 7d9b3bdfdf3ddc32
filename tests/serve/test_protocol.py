"""The wire schema in `rewardplane.serve.protocol`: one definition that every side agrees with."""

from __future__ import annotations

import base64
import dataclasses
import json
import random
import re
from pathlib import Path

import httpx
import pytest

from rewardplane.core.errors import UsageError
from rewardplane.serve.client import RewardClient
from rewardplane.serve.protocol import (
    DEPTH_CHUNK,
    ITEM_ERROR_CODES,
    MAX_JSON_DEPTH,
    ROUTE_ERROR_CODES,
    DetailedScore,
    ItemError,
    ItemErrorCode,
    ItemIn,
    ItemScores,
    RequestErrorCode,
    ScoreItem,
    ServeError,
    UniRLScoreRequest,
    decode_score_response,
    encode_score_request,
    item_fields,
    item_from_fields,
    item_to_wire,
    items_from_request,
    join_score_request,
    json_depth_exceeds,
    parse_score_request,
    parse_trainer_body,
    read_items,
    score_response,
)
from rewardplane.serve.scorers.rules import ExactMatchScorer
from support.serve import LiveServer, RecordingScorer, make_config, png_bytes

DOCS = Path(__file__).resolve().parents[2] / "docs" / "serve.md"
RICH = ScoreItem(
    id="a",
    prompt=[{"role": "user", "content": "2+2?"}],
    response="4",
    image=None,
    reference={"answer": 4, "tolerance": [0, 0.5], "note": None},
    group_id="prompt-7",
    metadata={"task": "math", "tags": ["x"], "difficulty": 2.5},
)


def test_the_wire_item_and_the_score_item_have_the_same_fields():
    assert set(ItemIn.model_fields) == {f.name for f in dataclasses.fields(ScoreItem)}


@pytest.mark.parametrize("multipart", [False, True])
def test_items_round_trip_through_the_json_and_multipart_encodings(multipart):
    with_image = dataclasses.replace(RICH, id="b", image=png_bytes((4, 3)), reference="four", metadata=None)
    plain = ScoreItem(id="c", prompt="p", response="r")
    payload, parts = encode_score_request([RICH, with_image, plain], ["s"], {"s": "x"}, multipart=multipart)
    assert bool(parts) == multipart
    req = parse_score_request(json.dumps(payload))
    assert items_from_request(req, parts) == [RICH, with_image, plain]
    assert "reference" not in payload["items"][2] and "metadata" not in payload["items"][1]


def test_transport_fields_are_the_wire_fields():
    assert item_from_fields(item_fields(RICH), None) == RICH
    assert item_to_wire(RICH) == item_fields(RICH)  # no image: the same JSON
    every_field = {f.name for f in dataclasses.fields(ScoreItem)} - {"image"}
    assert set(item_fields(RICH)) == every_field  # the codec walks the dataclass: none is left out


def test_an_items_file_reads_as_the_wire_items(tmp_path):
    """`rewardplane score` and `rewardplane bench --inputs` read one wire item per line, images as
    paths (relative to the file), `image_path`, `image_b64` or the wire's own `{"b64"}`."""
    png = png_bytes((3, 2))
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "x.png").write_bytes(png)
    b64 = base64.b64encode(png).decode()
    rows = [
        {**item_to_wire(RICH)},
        {"id": "p", "prompt": "p", "response": "r", "image": "imgs/x.png"},
        {"id": "q", "prompt": "p", "response": "r", "image_path": "imgs/x.png"},
        {"id": "s", "prompt": "p", "response": "r", "image_b64": b64},
        {"id": "t", "response": "r", "image": {"b64": b64}},
    ]
    path = tmp_path / "items.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    items = read_items(path)
    assert items[0] == RICH
    assert [i.image for i in items[1:]] == [png] * 4 and items[4].prompt == ""


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"id": "a", "response": "r"}\n{"id": "a", "response": "r"}', ":2: duplicate id 'a'"),
        ('{"id": "a", "response": "r", "metadata": {"x": NaN}}', ":1: NaN is not a JSON value"),
        ('{"id": "a", "response": "r", "image": "missing.png"}', ":1: image missing.png not found"),
        ('{"id": "a", "response": "r", "image": {"b64": "%%"}}', ":1: image.b64 is not valid base64"),
        ('{"id": "a", "response": "r", "image": {"part": "p"}}', ":1: image.part 'p' not in body"),
        ('{"id": "a", "response": "r", "group_id": 3}', ":1: group_id: Input should be a valid string"),
        ('["a"]', ":1: expected a JSON object"),
        ("not json", ":1: line is not valid JSON"),
        ('{"id": ""}', ":1: id: String should have at least 1 character"),
        ('{"id": "a", "prompt": 3}', ":1: prompt."),
        ('{"id": "a", "label": 1}', ":1: label: Extra inputs are not permitted"),
        ('{"id": "a", "image_b64": "%%%"}', ":1: image.b64 is not valid base64"),
        ("", ": no items"),
    ],
)
def test_an_items_file_refuses_a_bad_line_naming_it(tmp_path, line, message):
    path = tmp_path / "items.jsonl"
    path.write_text(line)
    with pytest.raises(UsageError) as info:
        read_items(path)
    assert str(info.value).startswith(str(path)) and message in str(info.value)


def test_a_response_decodes_to_what_was_encoded():
    """One encoder (the app's) and one decoder (the client's and the load generator's)."""
    items = [RICH, dataclasses.replace(RICH, id="b")]
    by_scorer = {
        "s": [DetailedScore(0.5, {"left_out": ["rm"]}), ItemError("non_finite", "NaN")],
        "t": [1.0, -2.0],
    }
    body = json.dumps(score_response(items, by_scorer, {"s": ("v", "i"), "t": ("v", "j")}))
    decoded = decode_score_response(body, ["a", "b"], ["s", "t"])
    assert decoded.problems == ()
    assert decoded.results == [
        ItemScores("a", {"s": 0.5, "t": 1.0}, {}, {"s": {"left_out": ["rm"]}}),
        ItemScores("b", {"t": -2.0}, {"s": {"code": "non_finite", "message": "NaN", "kind": "service"}}, {}),
    ]
    assert decode_score_response(body, ["b", "a"], ["s", "t"]).problems == ("order_mismatch",)
    assert decode_score_response(body, ["a", "b"], ["s"]).problems == ("extra_scorer",)


def test_pre_encoded_items_join_into_a_valid_request():
    body = join_score_request(["s", "t"], [json.dumps(item_to_wire(i)).encode() for i in (RICH, RICH)])
    assert parse_score_request(body).scorers == ["s", "t"]
    assert [i.to_score_item(None) for i in parse_score_request(body).items] == [RICH, RICH]


@pytest.mark.parametrize(
    "bad",
    [{"group_id": 3}, {"group_id": ["g"]}, {"metadata": ["not", "an", "object"]}, {"metadata": "x"}],
)
def test_new_fields_are_typed(bad):
    with pytest.raises(ServeError) as info:
        parse_score_request(json.dumps({"scorers": ["s"], "items": [{"id": "a", **bad}]}))
    assert info.value.code == "invalid_request"


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_literals_are_refused(constant):
    """Python's json reads them; a worker frame (allow_nan=False) could not carry them on."""
    body = '{"scorers": ["s"], "items": [{"id": "a", "metadata": {"x": CONSTANT}}]}'.replace(
        "CONSTANT", constant
    )
    with pytest.raises(ServeError) as info:
        parse_score_request(body)
    assert info.value.code == "invalid_request" and constant in info.value.message


def _doc_codes(heading: str, column: int) -> set[str]:
    """The backticked codes in `column` of the table under the paragraph that starts with `heading`."""
    text = DOCS.read_text()
    table = text[text.index(heading) :].split("\n\n")[1]
    return {
        code for row in table.splitlines()[2:] for code in re.findall(r"`([a-z_]+)`", row.split("|")[column])
    }


def test_docs_list_exactly_the_codes_the_protocol_defines():
    assert _doc_codes("Per-item errors", 1) == set(ITEM_ERROR_CODES)
    text = DOCS.read_text()
    table = text[text.index("Per-item errors") :].split("\n\n")[1]
    kinds = {row.split("|")[1].strip(" `"): row.split("|")[2].strip() for row in table.splitlines()[2:]}
    assert kinds == {code.value: code.kind for code in ItemErrorCode}  # one kind per code, as defined
    defined = {code.value for code in RequestErrorCode} | set(ROUTE_ERROR_CODES.values())
    assert _doc_codes("Whole-request errors", 2) == defined


def test_reference_group_id_and_metadata_reach_a_scorer_in_process():
    RecordingScorer.seen.clear()
    cfg = make_config([{"name": "rec", "kind": "recording"}, {"name": "exact", "kind": "exact_match"}])
    items = [RICH, dataclasses.replace(RICH, id="b", reference="4", image=png_bytes((4, 4)))]
    with LiveServer(cfg) as server, RewardClient(server.url, multipart=True, allow_partial=True) as client:
        assert [r.scores for r in client.score(items, ["rec"])] == [{"rec": 1.0}, {"rec": 1.0}]
        assert RecordingScorer.seen == items
        payload, _ = encode_score_request(items, ["exact"])  # plain JSON, base64 image
        results = httpx.post(server.url + "/v1/score", json=payload, timeout=30).json()["results"]
        assert results[0]["errors"]["exact"]["code"] == "bad_input"  # a JSON reference is not a string
        assert results[1]["scores"] == {"exact": 1.0}


def test_exact_match_reports_a_non_string_reference_per_item():
    out = ExactMatchScorer("e").score_batch([RICH, dataclasses.replace(RICH, reference=" 4 ")])
    assert out[0].code == "bad_input" and out[1] == 1.0


def _depth(value) -> int:
    """How deep arrays/objects nest in `value`, by plain recursion: what `json_depth_exceeds` checks."""
    if isinstance(value, dict):
        value = list(value.values())
    elif not isinstance(value, list):
        return 0
    return 1 + max(map(_depth, value), default=0)


def _nested(depth: int):
    """Objects and arrays in turn, `depth` levels around a scalar."""
    value = "leaf"
    for k in range(depth):
        value = [value, 1] if k % 2 else {"a": value, "b": None}
    return value


def _random_json(rng: random.Random, level: int = 0):
    roll = rng.random()
    if level > 7 or roll < 0.3:
        return rng.choice([1, 2.5, "s", None, True, "[{"])
    if roll < 0.65:
        return [_random_json(rng, level + 1) for _ in range(rng.randrange(4))]
    return {f"k{n}": _random_json(rng, level + 1) for n in range(rng.randrange(4))}


@pytest.mark.parametrize("width", [1, DEPTH_CHUNK + 3])
def test_json_depth_limit_is_exact_at_every_level_width(width):
    """The deepest container sits last in a level of `width` containers (across the walk's chunk
    boundary when wide); the limit holds exactly, one below and one above the true depth."""
    for inner in (0, 1, 2, 5, MAX_JSON_DEPTH - 4, MAX_JSON_DEPTH - 3, MAX_JSON_DEPTH - 2):
        shallow = {"history": [{"text": "t"}], "required_rewards": ["r"]}
        body = {"requests": [shallow] * (width - 1) + [{"metadata": _nested(inner)}]}
        depth = _depth(body)
        assert depth == max(5 if width > 1 else 3, 3 + inner)
        for limit in (depth - 1, depth, depth + 1):
            assert json_depth_exceeds(body, limit) is (depth > limit)
    rng = random.Random(7)
    for _ in range(2000):
        value = _random_json(rng)
        assert [json_depth_exceeds(value, limit) for limit in range(6)] == [
            _depth(value) > limit for limit in range(6)
        ]
    assert not json_depth_exceeds("a scalar body", 0) and json_depth_exceeds([], 0)


def test_a_trainer_body_nested_too_deep_is_refused_even_in_an_ignored_field():
    """Fields the gateway protocol ignores are still held to the depth limit (422, never a 500)."""
    for inner, refused in ((MAX_JSON_DEPTH - 1, False), (MAX_JSON_DEPTH, True)):
        raw = json.dumps({"protocol_version": "1", "requests": [], "extension": _nested(inner)})
        if not refused:
            assert parse_trainer_body(raw, UniRLScoreRequest).requests == []
            continue
        with pytest.raises(ServeError) as info:
            parse_trainer_body(raw, UniRLScoreRequest)
        assert info.value.code == "invalid_request" and "deeper than" in info.value.message
