"""verl 0.9's Reward Loop as the tests drive it: a `RewardLoopWorker` configured by the hydra
overrides docs/integrations.md gives, and the two shapes of data verl hands it (a padded rollout
chunk, one unpadded trajectory from the agent loop). Needs verl (installed with --no-deps)."""

from __future__ import annotations

import functools

import numpy as np
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl import DataProto
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

from rewardplane.data.builtin_tokenizer import build_tokenizer

QUESTIONS = ["Say hello.", "What is two plus two?", "Name a colour.", "Greet me politely."]
RESPONSES = ["Hello there!", "Four.", "Blue", "Good day to you, NAN friend."]
TRUTHS = ["Hello there!", "4", "blue", "hi"]
GOOD = RESPONSES[:3]  # the fourth has "NAN": the `double` scorer fails it


@functools.cache
def policy_tokenizer():
    return build_tokenizer([*QUESTIONS, *RESPONSES, *TRUTHS] * 10, vocab_size=400)


def dataset_row(i: int, *, extra_info: bool = True) -> dict:
    """A row's non-tensor fields as verl's data preparation writes them."""
    info = {"question": QUESTIONS[i], "index": i} if extra_info else {"index": i}
    return {
        "data_source": "rewardplane_test",
        "reward_model": {"ground_truth": TRUTHS[i], "style": "rule"},
        "extra_info": info,
    }


def padded_chunk(
    tokenizer, responses=RESPONSES, *, extra_info=True, prompt_len=12, response_len=12
) -> DataProto:
    """A rollout chunk as `RewardLoopManager.compute_rm_score` hands it to a worker: left-padded
    prompts, right-padded responses, one attention mask over both, the dataset's columns."""
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
    rows = [dataset_row(i, extra_info=extra_info) for i in range(n)]
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": resp,
            "attention_mask": mask,
            "input_ids": torch.cat([prompts, resp], 1),
        },
        non_tensors={key: np.array([row[key] for row in rows], dtype=object) for key in rows[0]},
    )


def trajectory(tokenizer, i: int, response: str) -> DataProto:
    """One finished trajectory as `AgentLoopWorker._compute_score` builds it for
    `reward_loop_worker.compute_score.remote(data)`: unpadded ids, the dataset row's fields, the
    agent loop's own (turns, tool fields, lengths)."""
    prompt_ids = torch.tensor(tokenizer(QUESTIONS[i], add_special_tokens=False)["input_ids"])
    response_ids = torch.tensor(
        [*tokenizer(response, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    )
    input_ids = torch.cat([prompt_ids, response_ids])
    batch = TensorDict(
        {
            "prompts": prompt_ids[None],
            "responses": response_ids[None],
            "attention_mask": torch.ones_like(input_ids)[None],
            "input_ids": input_ids[None],
            "position_ids": torch.arange(len(input_ids))[None],
        },
        batch_size=1,
    )
    non_tensor = {k: np.array([v]) for k, v in dataset_row(i).items()}
    non_tensor |= {
        "__num_turns__": np.array([2]),
        "tool_extra_fields": np.array([{}], dtype=object),
        "prompt_len": np.array([len(prompt_ids)]),
        "response_len": np.array([len(response_ids)]),
    }
    return DataProto(batch=batch, non_tensor_batch=non_tensor)


def reward_loop_worker(tmp_path, name: str, manager: str = "naive", **reward_kwargs) -> RewardLoopWorker:
    """A `RewardLoopWorker` configured as the hydra overrides of docs/integrations.md configure it
    (`reward_kwargs`: url, scorer, token, ...), with the policy's tokenizer saved under tmp_path."""
    tokenizer = policy_tokenizer()
    tokenizer.save_pretrained(tmp_path / "tok")
    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": "pkg://rewardplane.integrations.verl",
                    "name": name,
                    "reward_kwargs": reward_kwargs,
                },
                "reward_manager": {"source": "register", "name": manager},
                "reward_model": {"enable": False},
            },
            "actor_rollout_ref": {"model": {"path": str(tmp_path / "tok"), "tokenizer_path": None}},
        }
    )
    return RewardLoopWorker(config)


def chunk(responses=GOOD) -> DataProto:
    """`padded_chunk` of the policy tokenizer."""
    return padded_chunk(policy_tokenizer(), responses)
