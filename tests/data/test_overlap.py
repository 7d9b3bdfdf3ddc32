"""Training-data content keys: shape-independent, label-order-independent, compact, exact."""

from __future__ import annotations

import numpy as np

from rewardplane.data.normalize import normalize_row
from rewardplane.data.overlap import ContentHashes, TrainingContent, content_keys
from rewardplane.data.synth import generate_rows


def test_the_same_pair_in_another_shape_or_label_order_has_the_same_key():
    explicit = {
        "prompt": [{"role": "user", "content": "Name a fruit."}],
        "chosen": [{"role": "assistant", "content": "kiwi."}],
        "rejected": [{"role": "assistant", "content": "hammer."}],
    }
    implicit = {
        "chosen": [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "kiwi."}],
        "rejected": [
            {"role": "user", "content": "Name a fruit."},
            {"role": "assistant", "content": "hammer."},
        ],
    }
    flipped = {**explicit, "chosen": explicit["rejected"], "rejected": explicit["chosen"]}
    keys = [
        content_keys(normalize_row({**row, "id": f"id-{i}"}))
        for i, row in enumerate((explicit, implicit, flipped))
    ]
    assert keys[0] == keys[1]  # ids and shapes do not matter
    assert keys[2][0] == keys[0][0] and (keys[2][1], keys[2][2]) == (keys[0][2], keys[0][1])
    other_prompt = {**explicit, "prompt": [{"role": "user", "content": "Name an animal."}]}
    assert content_keys(normalize_row(other_prompt))[0] != keys[0][0]


def test_a_record_finds_exactly_the_training_pairs_and_round_trips():
    train, held_out = generate_rows(60, seed=0), generate_rows(20, seed=11)
    keys = ContentHashes()
    for row in train:
        keys.add(normalize_row(row))
    record = TrainingContent.from_bytes(keys.record().to_bytes())
    evaluated = ContentHashes()
    for row in [*train[:5], *held_out]:
        evaluated.add(normalize_row({**row, "id": "renamed-" + row["id"]}))
    found = record.find(evaluated)
    assert found.in_training[:5] == [True] * 5
    assert found.pairs == 5 + sum(found.in_training[5:])  # a held-out pair only if its content recurs
    assert found.summary()["evaluated"] == 25 and found.summary()["training_pairs"] == record.pairs.size
    union = record.union(TrainingContent.from_bytes(record.to_bytes()))
    assert np.array_equal(union.pairs, record.pairs)


def test_a_record_of_100k_pairs_stays_small():
    rng = np.random.default_rng(0)
    keys = lambda n: np.unique(rng.integers(0, 2**63, size=n, dtype=np.uint64))  # noqa: E731
    data = TrainingContent(keys(100_000), keys(200_000)).to_bytes()
    assert len(data) < 2.5e6  # 8 bytes a key, plus the npz container
