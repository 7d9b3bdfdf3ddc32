import base64
import dataclasses
import io
import json

import pytest
from PIL import Image

from rewardplane.bench.corpus import IMAGE_SIZES, corpus_digest, generate_corpus, item_digest, load_inputs
from rewardplane.core.errors import UsageError
from rewardplane.serve.protocol import ScoreItem, item_to_wire


def test_same_seed_same_bytes_other_seed_differs():
    a, b, c = generate_corpus(12, seed=3), generate_corpus(12, seed=3), generate_corpus(12, seed=4)
    assert a == b
    assert corpus_digest(a) == corpus_digest(b) != corpus_digest(c)


def test_items_are_distinct_and_varied():
    items = generate_corpus(40, seed=0)
    assert len({i.id for i in items}) == 40
    assert len({item_digest(i) for i in items}) == 40
    assert len({i.prompt for i in items}) > 20
    decoded = [Image.open(io.BytesIO(item.image)) for item in items]
    assert {d.format for d in decoded} == {"JPEG", "PNG"}
    assert len({d.size for d in decoded}) >= 3
    assert {d.size for d in decoded} <= set(IMAGE_SIZES)


def test_items_are_the_protocols_own_and_encode_as_the_wire_item():
    item = generate_corpus(1, seed=0)[0]
    assert isinstance(item, ScoreItem)
    payload = json.loads(json.dumps(item_to_wire(item)))
    assert set(payload) == {"id", "prompt", "response", "image"}
    assert base64.b64decode(payload["image"]["b64"]) == item.image
    text_only = generate_corpus(1, seed=0, images=False)[0]
    assert "image" not in item_to_wire(text_only)


def test_a_field_beyond_prompt_response_and_image_changes_the_digest_only_when_set():
    item = generate_corpus(1, seed=0)[0]
    with_reference = dataclasses.replace(item, reference="4")
    assert item_digest(dataclasses.replace(item, id="other")) == item_digest(item)
    assert item_digest(with_reference) != item_digest(item)


def test_load_inputs(tmp_path):
    (tmp_path / "cat.png").write_bytes(b"\x89PNG fake")
    lines = [
        {"id": "a", "prompt": "p", "response": "r", "image_path": "cat.png"},
        {"id": "b", "prompt": "p", "response": "r2", "image_b64": base64.b64encode(b"jpg").decode()},
        {"id": "c", "prompt": "p", "response": "r3"},
        {"id": "d", "prompt": "p", "response": "r4", "image": "cat.png"},
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    items = load_inputs(path)
    assert [i.id for i in items] == ["a", "b", "c", "d"]
    assert items[3].image == items[0].image
    assert items[0].image == b"\x89PNG fake" and items[1].image == b"jpg" and items[2].image is None


def test_load_inputs_refuses_a_line_the_service_would_refuse(tmp_path):
    """`bench --inputs` reads with the protocol's reader; its cases are in tests/serve/test_protocol.py."""
    path = tmp_path / "in.jsonl"
    path.write_text('{"id": "a", "prompt": "p", "response": "r", "label": 1}\n')
    with pytest.raises(UsageError, match=r"in.jsonl:1: label: Extra inputs are not permitted"):
        load_inputs(path)
