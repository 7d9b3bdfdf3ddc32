"""DPO objective pieces: TRL metrics, settings refusals, batch log-probs, the reference cache."""

from __future__ import annotations

import math
import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from rewardplane.core.errors import ConfigError
from rewardplane.data.collate import collate
from rewardplane.data.records import TokenizedBranch, TokenizedPair
from rewardplane.models.policy import batch_logps
from rewardplane.models.reference import parameter_digest
from rewardplane.models.tiny import tiny_config
from rewardplane.objectives.dpo import dpo_metrics
from rewardplane.objectives.dpo_reference import ReferenceCacheError, precompute_reference, tokenized_digest
from rewardplane.objectives.dpo_settings import DPOSettings, ReferenceSettings, check_lora

VOCAB = 89


def make_pairs(n: int, seed: int = 0) -> list[TokenizedPair]:
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randint(0, 9))]

        def branch(prompt: list[int] = prompt) -> TokenizedBranch:
            completion = [rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 8))]
            ids = prompt + completion
            return TokenizedBranch(ids, [0] * len(prompt) + [1] * len(completion), len(ids) - 1)

        pairs.append(TokenizedPair(f"p{i}", branch(), branch()))
    return pairs


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_config("tiny-llama", vocab_size=VOCAB)).eval()


def test_metrics_match_trl_definitions():
    pc = torch.tensor([-5.0, -3.0, -4.0, -2.0])
    pr = torch.tensor([-6.0, -3.0, -3.0, -2.0 - 1e-4])
    rc = torch.tensor([-5.5, -3.0, -4.0, -2.0])
    rr = torch.tensor([-5.5, -3.0, -3.5, -2.0])
    beta = 0.1
    m = dpo_metrics(pc, pr, rc, rr, beta=beta)
    chosen, rejected = beta * (pc - rc), beta * (pr - rr)  # TRL: chosen_rewards / rejected_rewards
    torch.testing.assert_close(m["rewards/chosen"], chosen)
    torch.testing.assert_close(m["rewards/rejected"], rejected)
    torch.testing.assert_close(m["rewards/margins"], chosen - rejected)
    assert m["rewards/accuracies"].tolist() == [1.0, 0.0, 0.0, 1.0]
    # pair 1 is an exact tie, pair 3's margin 1e-5 is above the 1e-6 tolerance
    assert m["rewards/tie_rate"].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert m["rewards/accuracies_tie_aware"].tolist() == [1.0, 0.5, 0.0, 1.0]
    assert m["logps/chosen"].tolist() == pc.tolist() and m["logps/rejected"].tolist() == pr.tolist()
    free = dpo_metrics(pc, pr, None, None, beta=beta)  # reference_free: π_ref ≡ 1
    torch.testing.assert_close(free["rewards/chosen"], beta * pc)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"temperature": 0.7}, "temperature=0.7"),
        ({"temperature": math.nan}, "temperature must be finite"),
        ({"temperature": math.inf}, "temperature must be finite"),
        ({"beta": 0.0}, "beta must be"),
        ({"loss_type": "kto"}, "loss_type must be one of"),
        ({"label_smoothing": 0.1, "loss_type": "ipo"}, "no meaning"),
        ({"reference": {"source": "snapshot", "repo": "a/b"}}, "needs revision, path"),
        ({"reference": {"source": "the_sft_model"}}, "source must be one of"),
        ({"reference": {"source": "initial_policy", "revision": "x"}}, "only apply to source: snapshot"),
        ({"loss_type": "reference_free", "precompute_reference": True}, "no reference"),
    ],
)
def test_settings_refuse_what_breaks_dpo(raw, message):
    raw = dict(raw)
    with pytest.raises(ConfigError, match=message):
        DPOSettings(reference=ReferenceSettings(**raw.pop("reference", {})), **raw)


def test_lora_needs_a_reference_strategy():
    with pytest.raises(ConfigError, match="LoRA needs an explicit reference strategy"):
        check_lora({"lora": {"r": 8}}, {})
    with pytest.raises(ConfigError, match="LoRA needs an explicit reference strategy"):
        check_lora({"lora": {}}, {"reference": {}})  # an empty section is LoRA with defaults
    check_lora({"lora": {"r": 8}}, {"reference": {"source": "initial_policy"}})
    check_lora({"lora": None}, None)
    check_lora({"tiny": "tiny-llama"}, None)


@pytest.mark.parametrize("average", [False, True])
def test_batch_logps_agree_across_layouts_and_with_single_sequences(policy, average):
    pairs = make_pairs(7, seed=1)
    results = {}
    with torch.no_grad():
        for layout in ("right", "left", "packed"):
            results[layout] = batch_logps(
                policy, collate(pairs, layout=layout, max_length=24), pairs, average=average
            )
        singles = [batch_logps(policy, collate([p], layout="right"), [p], average=average) for p in pairs]
    single_c = torch.cat([c for c, _ in singles])
    single_r = torch.cat([r for _, r in singles])
    for layout, (c, r) in results.items():
        torch.testing.assert_close(c, single_c, atol=1e-5, rtol=0, msg=layout)
        torch.testing.assert_close(r, single_r, atol=1e-5, rtol=0, msg=layout)


def test_precomputed_reference_equals_live_and_is_cached(policy, tmp_path):
    pairs = make_pairs(10, seed=2)
    common = {
        "cache_dir": tmp_path,
        "data_digest": tokenized_digest(pairs),
        "reference_digest": parameter_digest(policy),
        "average": False,
    }
    cached = precompute_reference(policy, pairs, batch_size=3, layout="packed", **common)
    # live: the reference scores the training micro-batches as they come
    live_c, live_r = [], []
    with torch.no_grad():
        for start in range(0, 10, 4):
            chunk = pairs[start : start + 4]
            c, r = batch_logps(policy, collate(chunk, layout="right"), chunk, average=False)
            live_c.append(c)
            live_r.append(r)
    got_c, got_r = cached.lookup(pairs, "cpu")
    torch.testing.assert_close(got_c, torch.cat(live_c), atol=1e-6, rtol=0)
    torch.testing.assert_close(got_r, torch.cat(live_r), atol=1e-6, rtol=0)
    assert len(list(tmp_path.glob("*.safetensors"))) == 1

    class Exploding(torch.nn.Module):
        def forward(self, *args, **kwargs):
            raise AssertionError("the cache should have been reused")

    again = precompute_reference(Exploding(), pairs, batch_size=3, **common)
    torch.testing.assert_close(again.chosen, cached.chosen, atol=0, rtol=0)
    # another reference digest is another key: recomputed, not reused
    precompute_reference(policy, pairs, batch_size=5, **{**common, "reference_digest": "0" * 64})
    assert len(list(tmp_path.glob("*.safetensors"))) == 2
    with pytest.raises(ReferenceCacheError, match="'zz' is not in the reference cache"):
        cached.lookup([TokenizedPair("zz", pairs[0].chosen, pairs[0].rejected)], "cpu")
