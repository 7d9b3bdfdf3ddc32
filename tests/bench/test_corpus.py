import base64
import io
import json

import pytest
from PIL import Image

from rewardplane.bench.corpus import IMAGE_SIZES, corpus_digest, generate_corpus, load_inputs
from rewardplane.core.errors import UsageError


def test_same_seed_same_bytes_other_seed_differs():
    a, b, c = generate_corpus(12, seed=3), generate_corpus(12, seed=3), generate_corpus(12, seed=4)
    assert a == b
    assert corpus_digest(a) == corpus_digest(b) != corpus_digest(c)


def test_items_are_distinct_and_varied():
    items = generate_corpus(40, seed=0)
    assert len({i.id for i in items}) == 40
    assert len({i.content_digest() for i in items}) == 40
    assert len({i.prompt for i in items}) > 20
    assert {i.image_format for i in items} == {"jpeg", "png"}
    assert len({i.image_size for i in items}) >= 3
    for item in items:
        decoded = Image.open(io.BytesIO(item.image))
        assert decoded.format == item.image_format.upper()
        assert decoded.size == item.image_size
        assert decoded.size in IMAGE_SIZES


def test_payload_is_the_wire_format():
    item = generate_corpus(1, seed=0)[0]
    payload = json.loads(json.dumps(item.payload()))
    assert set(payload) == {"id", "prompt", "response", "image"}
    assert base64.b64decode(payload["image"]["b64"]) == item.image
    text_only = generate_corpus(1, seed=0, images=False)[0]
    assert text_only.payload()["image"] is None


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


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            '{"id": "a", "prompt": "p", "response": "r"}\n{"id": "a", "prompt": "p", "response": "r"}',
            "duplicate id",
        ),
        ("not json", "invalid JSON"),
        ('{"id": "", "prompt": "p", "response": "r"}', "'id'"),
        ('{"id": "a", "prompt": 3, "response": "r"}', "strings"),
        ('{"id": "a", "prompt": "p", "response": "r", "image_b64": "%%%"}', "base64"),
        ("", "no items"),
    ],
)
def test_load_inputs_rejects(tmp_path, content, message):
    path = tmp_path / "in.jsonl"
    path.write_text(content)
    with pytest.raises(UsageError, match=message):
        load_inputs(path)
