"""TRL 1.16: `RemoteReward` / `AsyncRemoteReward` driven by TRL's own `GRPOTrainer` against a live server."""

from __future__ import annotations

import asyncio
import math
import pickle

import pytest

pytest.importorskip("trl")

import torch
from datasets import Dataset
from trl import GRPOTrainer
from trl.trainer.utils import get_callable_name, is_async_callable

from rewardplane.core.errors import UsageError
from rewardplane.integrations.trl import AsyncRemoteReward, RemoteReward, RemoteRewards
from rewardplane.serve.client import ScoreError, ServiceError
from support.serve import score_requests
from support.trl_policy import grpo_args, tiny_policy

PROMPTS = ["Say hello.", "Two plus two?", "Name a colour.", "Hi there."]


class RecordingGRPOTrainer(GRPOTrainer):
    """GRPOTrainer unchanged, except that it keeps what `_calculate_rewards` gave the loss."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.recorded = []

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self.recorded.append((list(prompts), list(completions), rewards.detach().clone()))
        return rewards


@pytest.mark.parametrize("conversational", [False, True], ids=["standard", "conversational"])
def test_grpo_trainer_trains_on_the_services_rewards(server, direct_scores, tmp_path, conversational):
    model, tokenizer = tiny_policy()
    prompts = [[{"role": "user", "content": p}] for p in PROMPTS] if conversational else PROMPTS
    args = grpo_args(tmp_path, tokenizer, max_steps=2)
    funcs = [RemoteReward(server.url, scorer="rm"), AsyncRemoteReward(server.url, scorer="len")]
    dataset = Dataset.from_dict({"prompt": prompts})
    trainer = RecordingGRPOTrainer(
        model=model, reward_funcs=funcs, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    trainer.train()

    assert trainer.reward_func_names == ["rewardplane_rm", "rewardplane_len"]
    assert len(trainer.recorded) == 2
    for step_prompts, completions, rewards in trainer.recorded:
        assert isinstance(completions[0], list if conversational else str)
        items = [
            {"id": str(i), "prompt": p, "response": c}
            for i, (p, c) in enumerate(zip(step_prompts, completions, strict=True))
        ]
        for column, scorer in enumerate(["rm", "len"]):
            expected = torch.tensor(direct_scores(server.url, scorer, items), dtype=torch.float64)
            assert torch.allclose(rewards[:, column].double(), expected, atol=1e-5, rtol=0), scorer
    logged = trainer.state.log_history[0]
    assert "rewards/rewardplane_rm/mean" in logged and "rewards/rewardplane_len/mean" in logged


def test_trl_sees_distinct_names_and_the_async_form(server):
    rm, length = RemoteReward(server.url, scorer="rm"), RemoteReward(server.url, scorer="len")
    assert {get_callable_name(rm), get_callable_name(length)} == {"rewardplane_rm", "rewardplane_len"}
    assert get_callable_name(RemoteReward(server.url, scorer="rm", name="rm_b")) == "rm_b"
    assert not is_async_callable(rm)
    assert is_async_callable(AsyncRemoteReward(server.url, scorer="rm"))


def test_failed_items_raise_by_default_naming_them(server):
    reward = RemoteReward(server.url, scorer="double")
    with pytest.raises(ScoreError) as info:
        reward(prompts=["p"] * 3, completions=["ok", "NAN here", "fine"])
    assert [(f.id, f.scorer, f.code) for f in info.value.failures] == [("1", "double", "non_finite")]


def test_on_error_none_returns_none_for_failed_items_only(server):
    metrics = {}
    reward = RemoteReward(server.url, scorer="double", on_error="none")
    out = reward(prompts=["p"] * 3, completions=["ok", "NAN", "fine"], log_metric=metrics.__setitem__)
    assert out == [2.0, None, 4.0]
    assert metrics == {"rewardplane_double/failed_frac": pytest.approx(1 / 3)}
    async_out = asyncio.run(
        AsyncRemoteReward(server.url, scorer="double", on_error="none")(["p", "p"], ["INF", "abc"])
    )
    assert async_out == [None, 3.0]


def test_whole_request_failures_raise_even_with_on_error_none(server):
    reward = RemoteReward(server.url, scorer="no_such_scorer", on_error="none")
    with pytest.raises(ServiceError) as info:
        reward(prompts=["p"], completions=["r"])
    assert info.value.code == "unknown_scorer"


def test_the_async_form_chunks_concurrently_and_works_across_event_loops(server):
    reward = AsyncRemoteReward(server.url, scorer="len", batch_size=2)
    completions = ["a" * n for n in range(1, 8)]
    for _ in range(2):  # a second asyncio.run: a new loop, so a new connection pool
        assert asyncio.run(reward(prompts=["p"] * 7, completions=completions)) == [
            float(n) for n in range(1, 8)
        ]


def test_conversational_rows_keep_roles_and_drop_extra_keys(server, direct_scores):
    prompts = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]]
    blocks = [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]
    completions = [[{"role": "assistant", "content": blocks, "tool_calls": []}]]
    got = RemoteReward(server.url, scorer="rm")(prompts=prompts, completions=completions)
    plain = [{"role": "assistant", "content": "Hello"}]
    assert got == pytest.approx(
        direct_scores(server.url, "rm", [{"id": "0", "prompt": prompts[0], "response": plain}])
    )
    with pytest.raises(UsageError, match="image"):
        image_turn = [{"role": "assistant", "content": [{"type": "image"}]}]
        RemoteReward(server.url, scorer="rm")(prompts=["p"], completions=[image_turn])


def test_reference_key_sends_a_dataset_column_as_reference(server):
    reward = RemoteReward(server.url, scorer="exact", reference_key="answer")
    assert reward(prompts=["2+2?", "3+3?"], completions=["4", "7"], answer=["4", "6"]) == [1.0, 0.0]
    with pytest.raises(UsageError, match="answer"):
        reward(prompts=["2+2?"], completions=["4"], solution=["4"])


def test_scorer_defaults_to_the_services_only_scorer(server, one_scorer_server, monkeypatch):
    assert RemoteReward(one_scorer_server.url).__name__ == "rewardplane_len"
    with pytest.raises(UsageError, match="name one"):
        RemoteReward(server.url)
    monkeypatch.setenv("REWARDPLANE_URL", server.url)
    monkeypatch.setenv("REWARDPLANE_SCORER", "len")
    assert RemoteReward()(prompts=["p"], completions=["abcd"]) == [4.0]
    with pytest.raises(UsageError, match="on_error"):
        RemoteReward(server.url, scorer="len", on_error="zero")


def test_reward_functions_pickle_without_their_connections(server):
    for cls in (RemoteReward, AsyncRemoteReward):
        reward = cls(server.url, scorer="len")
        if cls is RemoteReward:
            reward(prompts=["p"], completions=["ab"])
        clone = pickle.loads(pickle.dumps(reward))
        assert clone.__name__ == "rewardplane_len"
    assert clone is not None and not math.isnan(asyncio.run(clone(["p"], ["abc"]))[0])


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_grpo_trainer_gets_each_component_as_a_reward_function_from_one_request_per_batch(
    server, direct_components, tmp_path, asynchronous
):
    """Issue 38 item 4: `RemoteRewards(url, composite=...)` is one TRL reward function per
    component, so TRL's `reward_weights` and GDPO (`multi_objective_aggregation=
    "normalize_then_sum"`) apply; its functions share one `POST /v1/score` per batch."""
    model, tokenizer = tiny_policy()
    rewards = RemoteRewards(server.url, composite="reward", asynchronous=asynchronous)
    assert [get_callable_name(f) for f in rewards] == [
        "rewardplane_reward.model",
        "rewardplane_reward.length",
    ]
    assert all(is_async_callable(f) == asynchronous for f in rewards)
    assert rewards.weights == [0.5, 0.01]  # the composite's: TRL's weighted sum is its total
    args = grpo_args(
        tmp_path,
        tokenizer,
        max_steps=2,
        reward_weights=rewards.weights,
        multi_objective_aggregation="normalize_then_sum",
    )
    dataset = Dataset.from_dict({"prompt": PROMPTS})
    trainer = RecordingGRPOTrainer(
        model=model, reward_funcs=rewards, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    before = score_requests(server.url)
    trainer.train()
    assert score_requests(server.url) - before == len(trainer.recorded) == 2  # one per batch
    for step_prompts, completions, per_func in trainer.recorded:
        items = [
            {"id": str(i), "prompt": p, "response": c}
            for i, (p, c) in enumerate(zip(step_prompts, completions, strict=True))
        ]
        want = direct_components(server.url, "reward", items)
        for column, name in enumerate(["model", "length"]):
            expected = torch.tensor([w[name] for w in want], dtype=torch.float64)
            assert torch.allclose(per_func[:, column].double(), expected, atol=1e-5, rtol=0), name
    logged = trainer.state.log_history[0]
    assert (
        "rewards/rewardplane_reward.model/mean" in logged
        and "rewards/rewardplane_reward.length/mean" in logged
    )


def test_remote_rewards_for_several_scorers_share_one_request_per_batch(server, direct_scores):
    rm, length = rewards = RemoteRewards(server.url, scorers=["rm", "len"])
    assert rewards.weights == [1.0, 1.0] and [f.__name__ for f in rewards] == [
        "rewardplane_rm",
        "rewardplane_len",
    ]
    prompts, completions = ["Say hello.", "Hi"], ["Hello!", "Good day"]
    items = [
        {"id": str(i), "prompt": p, "response": c}
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True))
    ]
    before = score_requests(server.url)
    got = [f(prompts=prompts, completions=completions) for f in rewards]  # as TRL calls them, in order
    assert score_requests(server.url) - before == 1
    assert got[0] == pytest.approx(direct_scores(server.url, "rm", items), abs=1e-5)
    assert got[1] == [6.0, 8.0]
    before = score_requests(server.url)
    assert rm(prompts=prompts, completions=completions) == got[0]  # TRL's next step: a new batch
    assert length(prompts=prompts, completions=["a"] * 2) == [1.0, 1.0]  # other completions: anew
    assert score_requests(server.url) - before == 2
    clone = pickle.loads(pickle.dumps(rewards))
    assert [f.__name__ for f in clone] == ["rewardplane_rm", "rewardplane_len"]
    assert clone[1](prompts=["p"], completions=["abc"]) == [3.0]


def test_a_component_without_a_number_is_a_failure_never_a_value(server):
    """The composite failed the row (`guarded`, on_failure fail): every component function fails
    it, TRL's unscorable row. A component left out under `renormalize` (`lenient`) has no number:
    its function fails the row, the other component scores it."""
    completions = ["abcd", "NAN!"]
    guarded = RemoteRewards(server.url, composite="guarded", on_error="none")
    assert [f(prompts=["p", "p"], completions=completions) for f in guarded] == [[4.0, None], [4.0, None]]
    lenient = RemoteRewards(server.url, composite="lenient", on_error="none")
    metrics = {}
    got = [f(prompts=["p", "p"], completions=completions, log_metric=metrics.__setitem__) for f in lenient]
    assert got == [[4.0, 4.0], [4.0, None]]
    assert metrics["rewardplane_lenient.dbl/failed_frac"] == 0.5
    strict = RemoteRewards(server.url, composite="lenient")
    assert strict[0](prompts=["p", "p"], completions=completions) == [4.0, 4.0]
    with pytest.raises(ScoreError) as info:
        strict[1](prompts=["p", "p"], completions=completions)
    ((failure),) = info.value.failures
    assert (failure.id, failure.scorer, failure.code) == ("1", "lenient.dbl", "non_finite")
    with pytest.raises(UsageError, match="not a composite"):
        RemoteRewards(server.url, composite="len")
    with pytest.raises(UsageError, match="one of them"):
        RemoteRewards(server.url)


def test_item_penalty_rewards_the_items_own_failures_and_service_failures_still_follow_on_error(server):
    """`double`: "ERR" is an item-kind failure (the policy's doing), "NAN" a service-kind one."""
    metrics = {}
    reward = RemoteReward(server.url, scorer="double", on_error="none", item_penalty=-1.0)
    out = reward(prompts=["p"] * 3, completions=["ok", "ERR", "NAN"], log_metric=metrics.__setitem__)
    assert out == [2.0, -1.0, None]
    assert metrics == {
        "rewardplane_double/failed_frac": pytest.approx(1 / 3),
        "rewardplane_double/penalised_frac": pytest.approx(1 / 3),
    }
    with pytest.raises(ScoreError) as info:
        RemoteReward(server.url, scorer="double")(prompts=["p"] * 3, completions=["ok", "ERR", "NAN"])
    assert [(f.code, f.kind) for f in info.value.failures] == [
        ("bad_image", "item"),
        ("non_finite", "service"),
    ]
    assert [f.id for f in info.value.item_failures] == ["1"] and [
        f.id for f in info.value.service_failures
    ] == ["2"]
    with pytest.raises(UsageError, match="item_penalty"):
        RemoteReward(server.url, scorer="double", item_penalty=float("nan"))
