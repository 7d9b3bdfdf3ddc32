import pytest
import torch

from rewardplane.data.collate import collate
from rewardplane.data.records import TokenizedPair
from rewardplane.objectives.reward_model import score_pairs
from support.rm import EOS, branch, random_pairs, tiny_reward_model


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-bert"])
@pytest.mark.parametrize("pad_is_eos", [False, True])
def test_layouts_give_identical_scores(name, pad_is_eos):
    model = tiny_reward_model(name)
    pairs = random_pairs(9, seed=1, eos=EOS if pad_is_eos else None)
    pad = EOS if pad_is_eos else 0
    scores = {}
    with torch.no_grad():
        for layout in ("right", "left", "packed"):
            scores[layout] = model(collate(pairs, layout=layout, pad_token_id=pad, max_length=32))
    assert torch.allclose(scores["right"], scores["left"], atol=1e-5, rtol=0)
    assert torch.allclose(scores["right"], scores["packed"], atol=1e-5, rtol=0)
    # each sequence alone, no padding at all, is the reference
    single = torch.stack(
        [model(collate([p], layout="right", pad_token_id=pad))[k] for k in (0, 1) for p in pairs[:3]]
    )
    expected = torch.cat([scores["right"][:3], scores["right"][9:12]])
    assert torch.allclose(single, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-bert"])
def test_sequences_exactly_at_max_length(name):
    model = tiny_reward_model(name)
    max_length = 16
    full = list(range(4, 4 + max_length))
    pairs = [
        TokenizedPair("full", branch(full), branch(full[:5])),
        TokenizedPair("short", branch(full[:7], trailing=2), branch(list(reversed(full)))),
    ]
    with torch.no_grad():
        right = model(collate(pairs, layout="right", max_length=max_length))
        left = model(collate(pairs, layout="left", max_length=max_length))
        batch = collate(pairs, layout="packed", max_length=max_length)
        packed = model(batch)
    assert batch.input_ids.shape[1] == max_length
    assert torch.allclose(right, left, atol=1e-5, rtol=0)
    assert torch.allclose(right, packed, atol=1e-5, rtol=0)


def test_packed_rows_respect_capacity_and_count_padding():
    pairs = random_pairs(12, seed=3)
    batch = collate(pairs, layout="packed", max_length=24)
    assert batch.input_ids.shape[1] <= 24
    assert batch.num_tokens == sum(p.num_tokens for p in pairs)
    right = collate(pairs, layout="right")
    assert batch.padding_efficiency > right.padding_efficiency
    assert int((batch.segment_ids >= 0).sum()) == batch.num_tokens


def test_collate_rejects_bad_inputs():
    long = TokenizedPair("long", branch(list(range(4, 30))), branch([5, 6]))
    with pytest.raises(ValueError, match="exceeds max_length"):
        collate([long], max_length=10)
    bad = TokenizedPair("bad", branch([5, 6]), branch([5, 6]).__class__([5, 6], [0, 1], 7))
    with pytest.raises(ValueError, match="score_index"):
        collate([bad])
    with pytest.raises(ValueError, match="empty"):
        collate([])


@pytest.mark.parametrize("layout", ["right", "packed"])
def test_score_pairs_is_batch_size_invariant(layout):
    model = tiny_reward_model()
    pairs = random_pairs(11, seed=5)
    c1, r1 = score_pairs(model, pairs, batch_size=1, layout=layout)
    c4, r4 = score_pairs(model, pairs, batch_size=4, layout=layout)
    c11, r11 = score_pairs(model, pairs, batch_size=11, layout=layout)
    assert c1.dtype.name == "float64" and c1.shape == (11,)
    for c, r in ((c4, r4), (c11, r11)):
        assert abs(c - c1).max() < 1e-5 and abs(r - r1).max() < 1e-5
