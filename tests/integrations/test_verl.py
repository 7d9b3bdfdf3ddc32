"""verl 0.9.1: `rewardplane.integrations.verl` loaded by verl's own custom-reward loader and run by
its Reward Loop (`RewardLoopWorker` with the `naive` reward manager, the trainer's only reward path
in 0.9), against a live server.

Two shapes of call, both verl's own code: `RewardLoopWorker.compute_score` on one trajectory as the
agent loop builds it when its generation ends (`AgentLoopWorker._compute_score`, the default path
without a reward model of verl's), and `RewardLoopWorker.compute_score_batch` on a padded chunk with
the manager class's `assemble_rm_scores`, as `RewardLoopManager.compute_rm_score` does (Ray's actor
transport between them is not run here)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("verl.experimental.reward_loop")

import torch
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
from verl.trainer.ppo.reward import resolve_reward_manager_cls

from rewardplane.core.errors import UsageError
from rewardplane.integrations import verl as rk_verl
from rewardplane.serve.client import ScoreError
from support.verl_loop import (
    GOOD,
    QUESTIONS,
    RESPONSES,
    TRUTHS,
    padded_chunk,
    policy_tokenizer,
    reward_loop_worker,
    trajectory,
)

NAMES = ["compute_score_async", "compute_score"]


@pytest.fixture(scope="module")
def tokenizer():
    return policy_tokenizer()


def run(w: RewardLoopWorker, coroutine):
    return w.loop.run_until_complete(coroutine)


def expected(direct_scores, url, scorer, n=3):
    items = [
        {"id": str(i), "prompt": QUESTIONS[i], "response": RESPONSES[i], "reference": TRUTHS[i]}
        for i in range(n)
    ]
    return direct_scores(url, scorer, items)


@pytest.mark.parametrize("name", NAMES)
def test_the_agent_loop_scores_each_trajectory_through_the_reward_loop(
    server, direct_scores, tokenizer, tmp_path, name
):
    """The default path of verl 0.9 without a reward model of its own: one trajectory at a time,
    as its generation ends; `compute_score_async` is awaited, `compute_score` runs in a thread."""
    w = reward_loop_worker(tmp_path, name, url=server.url, scorer="rm")
    assert w.reward_manager.is_async_reward_score == (name == "compute_score_async")
    outs = [run(w, w.compute_score(trajectory(tokenizer, i, RESPONSES[i]))) for i in range(3)]
    want = expected(direct_scores, server.url, "rm")
    assert [o["reward_score"] for o in outs] == pytest.approx(want, abs=1e-5, rel=0)
    assert [o["reward_extra_info"]["acc"] for o in outs] == [o["reward_score"] for o in outs]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("scorer", ["rm", "exact"])
def test_a_chunk_lands_on_each_responses_last_token(server, direct_scores, tokenizer, tmp_path, name, scorer):
    """`RewardLoopManager.compute_rm_score`'s work for one worker: `compute_score_batch` (one task
    per sample, concurrent) and the manager class's `assemble_rm_scores` into `rm_scores`."""
    w = reward_loop_worker(tmp_path, name, url=server.url, scorer=scorer)
    data = padded_chunk(tokenizer, GOOD)
    outputs = run(w, w.compute_score_batch(data))
    rm_scores = resolve_reward_manager_cls(w.config).assemble_rm_scores(
        data, [o["reward_score"] for o in outputs]
    )
    lengths = data.batch["attention_mask"][:, data.batch["prompts"].shape[1] :].sum(-1)
    for row, length in zip(
        rm_scores, lengths, strict=True
    ):  # the reward sits on the last response token only
        assert torch.count_nonzero(row[: length - 1]) == 0 and torch.count_nonzero(row[length:]) == 0
    got = [float(rm_scores[i, lengths[i] - 1]) for i in range(len(lengths))]
    assert got == pytest.approx(expected(direct_scores, server.url, scorer), abs=1e-5, rel=0)


@pytest.mark.parametrize("name", NAMES)
def test_an_item_error_fails_the_step_never_0(server, tokenizer, tmp_path, name):
    w = reward_loop_worker(tmp_path, name, url=server.url, scorer="double")
    with pytest.raises(ScoreError) as info:
        run(w, w.compute_score_batch(padded_chunk(tokenizer)))
    assert [(f.scorer, f.code) for f in info.value.failures] == [("double", "non_finite")]


@pytest.mark.parametrize("name", NAMES)
def test_a_missing_prompt_is_an_error_only_for_scorers_that_read_it(server, tokenizer, tmp_path, name):
    data = padded_chunk(tokenizer, GOOD, extra_info=False)
    w = reward_loop_worker(tmp_path, name, url=server.url, scorer="rm")
    with pytest.raises(UsageError, match=r"extra_info\['prompt'\]"):
        run(w, w.compute_score_batch(data))
    w = reward_loop_worker(tmp_path, name, url=server.url, scorer="exact")
    assert [o["reward_score"] for o in run(w, w.compute_score_batch(data))] == [1.0, 0.0, 1.0]


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
    monkeypatch.delenv("REWARDPLANE_URL")
    with pytest.raises(UsageError, match="REWARDPLANE_URL"):
        rk_verl.compute_score("src", "abc", None, {"question": "q"})


def test_the_rate_limited_manager_pitfall_is_real(server, tokenizer, tmp_path):
    """docs/integrations.md warns that verl's `rate_limited` manager turns any exception into a
    reward of 0.0; this keeps that warning true for the installed verl."""
    w = reward_loop_worker(tmp_path, "compute_score", manager="rate_limited", url=server.url, scorer="double")
    out = run(w, w.compute_score_batch(padded_chunk(tokenizer)))
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
        worker = reward_loop_worker(tmp_path, "compute_score_async", url=live.url, scorer="len")
        data = padded_chunk(tokenizer)
        n = len(data)
        data.non_tensor_batch["tool_extra_fields"] = np.array([{"global_steps": 7}] * n, dtype=object)
        run(worker, worker.compute_score_batch(data))
        deadline = time.monotonic() + 120
        while (body := httpx.get(f"{live.url}/v1/audit").json())["counts"]["audited"] < n:
            assert time.monotonic() < deadline, body["counts"]
            time.sleep(0.05)
    assert [v["version"] for v in body["versions"]] == [7] and body["counts"]["unversioned"] == 0
    assert body["versions"][0]["sources"]["rewardplane_test"]["n"] == n


@pytest.mark.parametrize("name", NAMES)
def test_a_composite_answers_with_its_components_and_verls_gdpo_reads_them(
    server, direct_components, direct_scores, tokenizer, tmp_path, name
):
    """Issue 38 item 4: for a composite, `compute_score*` return `{"score": total, <component>:
    value}`; verl's reward manager keeps the total as the reward and every key as extra reward
    info, which its GDPO advantage reads by `algorithm.gdpo_reward_keys`."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import compute_gdpo_outcome_advantage

    w = reward_loop_worker(tmp_path, name, url=server.url, scorer="reward")
    data = padded_chunk(tokenizer, GOOD)
    outputs = run(w, w.compute_score_batch(data))
    items = [
        {"id": str(i), "prompt": QUESTIONS[i], "response": RESPONSES[i], "reference": TRUTHS[i]}
        for i in range(3)
    ]
    totals, parts = direct_scores(server.url, "reward", items), direct_components(server.url, "reward", items)
    assert [o["reward_score"] for o in outputs] == pytest.approx(totals, abs=1e-5)
    for out, want, total in zip(outputs, parts, totals, strict=True):
        assert set(out["reward_extra_info"]) == {"score", "model", "length"}
        assert out["reward_extra_info"]["score"] == pytest.approx(total, abs=1e-5)
        assert {k: out["reward_extra_info"][k] for k in want} == pytest.approx(want, abs=1e-5)

    def gdpo(extra_infos: list[dict]) -> torch.Tensor:
        # the batch as RewardLoopManager.compute_rm_score builds it: one array per extra-info key
        keys = list(extra_infos[0])
        non_tensor = {k: np.array([info[k] for info in extra_infos]) for k in keys}
        rewards = resolve_reward_manager_cls(w.config).assemble_rm_scores(
            data, [i["score"] for i in extra_infos]
        )
        mask = data.batch["attention_mask"][:, data.batch["prompts"].shape[1] :]
        config = OmegaConf.create(
            {"gdpo_reward_keys": ["model", "length"], "gdpo_reward_weights": [0.5, 0.01]}
        )
        return compute_gdpo_outcome_advantage(
            rewards, mask, np.array(["q"] * 3), config=config, non_tensor_batch=non_tensor, batch=data.batch
        )[0]

    ours = gdpo([o["reward_extra_info"] for o in outputs])
    reference = gdpo([{"score": t, **p} for t, p in zip(totals, parts, strict=True)])
    assert torch.isfinite(ours).all() and torch.allclose(ours, reference, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_a_component_without_a_number_fails_the_sample_and_components_false_gives_the_total(
    server, tokenizer, tmp_path, name
):
    """verl stacks each extra-info key over the samples: an answer without a component (left out
    by `renormalize`) cannot ride along, so it raises; `components=false` keeps the total alone."""
    data = padded_chunk(tokenizer)  # the fourth response has "NAN": `lenient` leaves `dbl` out
    w = reward_loop_worker(tmp_path, name, url=server.url, scorer="lenient")
    with pytest.raises(ScoreError) as info:
        run(w, w.compute_score_batch(data))
    assert [(f.scorer, f.code) for f in info.value.failures] == [("lenient.dbl", "non_finite")]
    w = reward_loop_worker(tmp_path, name, url=server.url, scorer="lenient", components=False)
    outputs = run(w, w.compute_score_batch(data))
    assert all(set(o["reward_extra_info"]) == {"acc"} for o in outputs)  # a float: verl's own key
    assert outputs[3]["reward_score"] == 3 * len(RESPONSES[3])  # renormalised: len alone, scaled


@pytest.mark.parametrize("name", NAMES)
def test_item_penalty_rewards_the_items_own_failure_and_a_service_failure_still_raises(
    server, tokenizer, tmp_path, name
):
    """`double`: "ERR" is an item-kind failure (penalised), "NAN" a service-kind one (raises)."""
    responses = [GOOD[0], "ERR", GOOD[2]]
    w = reward_loop_worker(tmp_path, name, url=server.url, scorer="double", item_penalty=-1.0)
    outputs = run(w, w.compute_score_batch(padded_chunk(tokenizer, responses)))
    assert [o["reward_score"] for o in outputs] == [float(len(GOOD[0])), -1.0, float(len(GOOD[2]))]
    with pytest.raises(ScoreError) as info:
        run(w, w.compute_score_batch(padded_chunk(tokenizer, [GOOD[0], "NAN"])))
    assert [(f.code, f.kind) for f in info.value.failures] == [("non_finite", "service")]
