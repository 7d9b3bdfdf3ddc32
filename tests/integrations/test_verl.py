"""verl 0.9: `rewardplane.integrations.verl` loaded by verl's own custom-reward loader and run by its
reward managers (the trainer's reward-loop worker with the naive manager; the legacy naive and
batch managers) on a small DataProto, against a live server."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("verl.trainer.ppo.reward")

import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
from verl.trainer.ppo.reward import get_custom_reward_fn
from verl.workers.reward_manager import BatchRewardManager, NaiveRewardManager

from rewardplane.core.errors import UsageError
from rewardplane.data.builtin_tokenizer import build_tokenizer
from rewardplane.integrations import verl as rk_verl
from rewardplane.serve.client import ScoreError

QUESTIONS = ["Say hello.", "What is two plus two?", "Name a colour.", "Greet me politely."]
RESPONSES = ["Hello there!", "Four.", "Blue", "Good day to you, NAN friend."]
TRUTHS = ["Hello there!", "4", "blue", "hi"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer([*QUESTIONS, *RESPONSES, *TRUTHS] * 10, vocab_size=400)


def make_batch(
    tokenizer, responses=RESPONSES, *, extra_info=True, prompt_len=12, response_len=12
) -> DataProto:
    """What verl's rollout hands the reward manager: left-padded prompts, right-padded responses,
    one attention mask over both, and the dataset's non-tensor columns."""
    n = len(responses)
    prompts = torch.full((n, prompt_len), tokenizer.pad_token_id)
    resp = torch.full((n, response_len), tokenizer.pad_token_id)
    mask = torch.zeros((n, prompt_len + response_len), dtype=torch.long)
    for i, (q, r) in enumerate(zip(QUESTIONS[:n], responses, strict=True)):
        q_ids = tokenizer(q, add_special_tokens=False)["input_ids"][-prompt_len:]
        r_ids = tokenizer(r, add_special_tokens=False)["input_ids"][: response_len - 1] + [
            tokenizer.eos_token_id
        ]
        prompts[i, prompt_len - len(q_ids) :] = torch.tensor(q_ids)
        resp[i, : len(r_ids)] = torch.tensor(r_ids)
        mask[i, prompt_len - len(q_ids) : prompt_len + len(r_ids)] = 1
    infos = [{"question": q, "index": i} if extra_info else {"index": i} for i, q in enumerate(QUESTIONS[:n])]
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": resp,
            "attention_mask": mask,
            "input_ids": torch.cat([prompts, resp], dim=1),
        },
        non_tensors={
            "data_source": np.array(["rewardplane_test"] * n, dtype=object),
            "reward_model": np.array(
                [{"ground_truth": t, "style": "rule"} for t in TRUTHS[:n]], dtype=object
            ),
            "extra_info": np.array(infos, dtype=object),
        },
    )


def reward_config(name: str, **reward_kwargs) -> OmegaConf:
    return OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": "pkg://rewardplane.integrations.verl",
                    "name": name,
                    "reward_kwargs": reward_kwargs,
                },
                "reward_manager": {"source": "register", "name": "naive"},
                "reward_model": {"enable": False},
            }
        }
    )


def last_token_rewards(reward_tensor: torch.Tensor, data: DataProto) -> list[float]:
    prompt_len = data.batch["prompts"].shape[-1]
    lengths = data.batch["attention_mask"][:, prompt_len:].sum(-1)
    for row, length in zip(
        reward_tensor, lengths, strict=True
    ):  # the reward sits on the last response token only
        assert torch.count_nonzero(row[: length - 1]) == 0 and torch.count_nonzero(row[length:]) == 0
    return [float(reward_tensor[i, lengths[i] - 1]) for i in range(len(lengths))]


def expected(direct_scores, url, scorer, responses=RESPONSES, truths=TRUTHS):
    items = [
        {"id": str(i), "prompt": q, "response": r, "reference": t}
        for i, (q, r, t) in enumerate(zip(QUESTIONS[: len(responses)], responses, truths, strict=True))
    ]
    return direct_scores(url, scorer, items)


GOOD = RESPONSES[:3]  # the fourth has "NAN": the `double` scorer fails it


@pytest.mark.parametrize("scorer", ["rm", "exact"])
def test_legacy_naive_manager(server, direct_scores, tokenizer, scorer):
    fn = get_custom_reward_fn(reward_config("compute_score", url=server.url, scorer=scorer))
    data = make_batch(tokenizer, GOOD)
    manager = NaiveRewardManager(tokenizer=tokenizer, num_examine=0, compute_score=fn)
    got = last_token_rewards(manager(data), data)
    want = expected(direct_scores, server.url, scorer, GOOD, TRUTHS[:3])
    assert got == pytest.approx(want, abs=1e-5, rel=0)


@pytest.mark.parametrize("scorer", ["rm", "exact"])
def test_batch_manager(server, direct_scores, tokenizer, scorer):
    fn = get_custom_reward_fn(reward_config("compute_score_batch", url=server.url, scorer=scorer))
    data = make_batch(tokenizer, GOOD)
    manager = BatchRewardManager(tokenizer=tokenizer, num_examine=0, compute_score=fn)
    got = last_token_rewards(manager(data), data)
    assert got == pytest.approx(
        expected(direct_scores, server.url, scorer, GOOD, TRUTHS[:3]), abs=1e-5, rel=0
    )


def reward_loop_worker(tokenizer, tmp_path, name: str, **reward_kwargs) -> RewardLoopWorker:
    tokenizer.save_pretrained(tmp_path / "tok")
    config = reward_config(name, **reward_kwargs)
    config.actor_rollout_ref = {"model": {"path": str(tmp_path / "tok"), "tokenizer_path": None}}
    return RewardLoopWorker(config)


@pytest.mark.parametrize("name", ["compute_score", "compute_score_async"])
def test_reward_loop_worker_with_the_naive_manager(server, direct_scores, tokenizer, tmp_path, name):
    """The trainer's own path in verl 0.9: RewardLoopWorker -> load_reward_manager -> the custom
    function -> the reward-loop NaiveRewardManager.run_single, one task per sample."""
    worker = reward_loop_worker(tokenizer, tmp_path, name, url=server.url, scorer="rm")
    data = make_batch(tokenizer, GOOD)
    outputs = worker.loop.run_until_complete(worker.compute_score_batch(data))
    got = [o["reward_score"] for o in outputs]
    assert got == pytest.approx(expected(direct_scores, server.url, "rm", GOOD, TRUTHS[:3]), abs=1e-5, rel=0)

    failing = reward_loop_worker(tokenizer, tmp_path, name, url=server.url, scorer="double")
    with pytest.raises(ScoreError, match="non_finite"):  # a failed item fails the step; it is not 0.0
        failing.loop.run_until_complete(failing.compute_score_batch(make_batch(tokenizer)))


def test_item_failures_raise_through_the_managers(server, tokenizer):
    data = make_batch(tokenizer)
    naive = get_custom_reward_fn(reward_config("compute_score", url=server.url, scorer="double"))
    with pytest.raises(ScoreError) as info:
        NaiveRewardManager(tokenizer=tokenizer, num_examine=0, compute_score=naive)(data)
    assert [(f.scorer, f.code) for f in info.value.failures] == [("double", "non_finite")]
    batch = get_custom_reward_fn(reward_config("compute_score_batch", url=server.url, scorer="double"))
    with pytest.raises(ScoreError) as info:
        BatchRewardManager(tokenizer=tokenizer, num_examine=0, compute_score=batch)(data)
    assert [(f.id, f.code) for f in info.value.failures] == [("3", "non_finite")]


def test_an_unreachable_service_raises(tokenizer):
    fn = get_custom_reward_fn(
        reward_config("compute_score", url="http://127.0.0.1:9", scorer="rm", max_retries=0)
    )
    with pytest.raises(Exception) as info:
        NaiveRewardManager(tokenizer=tokenizer, num_examine=0, compute_score=fn)(make_batch(tokenizer, GOOD))
    assert "connect" in type(info.value).__name__.lower() or "connect" in str(info.value).lower()


def test_a_missing_prompt_is_an_error_only_for_scorers_that_read_it(server, tokenizer):
    data = make_batch(tokenizer, GOOD, extra_info=False)
    fn = get_custom_reward_fn(reward_config("compute_score", url=server.url, scorer="rm"))
    with pytest.raises(UsageError, match=r"extra_info\['prompt'\]"):
        NaiveRewardManager(tokenizer=tokenizer, num_examine=0, compute_score=fn)(data)
    fn = get_custom_reward_fn(reward_config("compute_score", url=server.url, scorer="exact"))
    got = last_token_rewards(
        NaiveRewardManager(tokenizer=tokenizer, num_examine=0, compute_score=fn)(data), data
    )
    assert got == [1.0, 0.0, 1.0]


def test_prompt_as_messages_and_settings_from_the_environment(server, direct_scores, monkeypatch):
    monkeypatch.setenv("REWARDPLANE_URL", server.url)
    monkeypatch.setenv("REWARDPLANE_SCORER", "rm")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]
    got = rk_verl.compute_score(
        "src", "Hello!", None, extra_info={"prompt": np.array(messages, dtype=object)}
    )
    want = direct_scores(server.url, "rm", [{"id": "0", "prompt": messages, "response": "Hello!"}])
    assert got == pytest.approx(want[0], abs=1e-5)
    assert asyncio.run(
        rk_verl.compute_score_async("src", "Hello!", None, {"prompt": messages})
    ) == pytest.approx(got)
    assert rk_verl.compute_score("src", "abc", 3, {"question": "q"}, scorer="len") == 3.0
    assert rk_verl.compute_score("src", "3", np.int64(3), {"question": "q"}, scorer="exact") == 1.0
    with pytest.raises(UsageError, match="no scorer 'nope'"):
        rk_verl.compute_score("src", "abc", None, {"question": "q"}, scorer="nope")
    monkeypatch.delenv("REWARDPLANE_URL")
    with pytest.raises(UsageError, match="REWARDPLANE_URL"):
        rk_verl.compute_score("src", "abc", None, {"question": "q"})


def test_the_rate_limited_manager_pitfall_is_real(server, tokenizer, tmp_path):
    """docs/integrations.md warns that verl's `rate_limited` manager turns any exception into a
    reward of 0.0; this keeps that warning true for the installed verl."""
    worker = reward_loop_worker(tokenizer, tmp_path, "compute_score", url=server.url, scorer="double")
    worker.config.reward.reward_manager.name = "rate_limited"
    worker._init_reward_fn()
    out = worker.loop.run_until_complete(worker.compute_score_batch(make_batch(tokenizer)))
    assert out[3]["reward_score"] == 0.0 and "non_finite" in out[3]["reward_extra_info"]["error"]


def test_the_rollouts_step_and_data_source_reach_the_services_audit(tokenizer, tmp_path):
    """verl 0.9's reward loop merges the rollout server's `extra_fields` (`global_steps`: the
    step of the weights that generated the response) into `extra_info`: the adapter sends it as
    the item's `policy_version`, and `data_source` as its source (docs/audit.md)."""
    import time

    import httpx

    from support.serve import LiveServer, make_config

    audit = {"proxy": "len", "auditors": ["words"], "sample": 1.0, "min_items": 3, "batch_wait_s": 0}
    scorers = [
        {"name": "len", "kind": "length"},
        {"name": "words", "kind": "length", "options": {"unit": "words"}},
    ]
    with LiveServer(make_config(scorers, audit=audit)) as live:
        worker = reward_loop_worker(tokenizer, tmp_path, "compute_score_async", url=live.url, scorer="len")
        data = make_batch(tokenizer, GOOD)
        data.non_tensor_batch["tool_extra_fields"] = np.array([{"global_steps": 7}] * len(GOOD), dtype=object)
        worker.loop.run_until_complete(worker.compute_score_batch(data))
        deadline = time.monotonic() + 20
        while (body := httpx.get(f"{live.url}/v1/audit").json())["counts"]["audited"] < len(GOOD):
            assert time.monotonic() < deadline, body["counts"]
            time.sleep(0.05)
    assert [v["version"] for v in body["versions"]] == [7] and body["counts"]["unversioned"] == 0
    assert body["versions"][0]["sources"]["rewardplane_test"]["n"] == len(GOOD)
