"""Builders shared by the rm test files: tokenized pairs and tiny models without the data pipeline."""

from __future__ import annotations

import random

import torch

from rewardplane.data.records import TokenizedBranch, TokenizedPair

torch.set_num_threads(1)  # 2 shared cores: threads only add contention for these tiny models

VOCAB = 97
EOS = 3


def branch(ids: list[int], trailing: int = 0) -> TokenizedBranch:
    """A branch whose last `trailing` tokens are template tokens after the completion."""
    score = len(ids) - 1 - trailing
    mask = [0] * (len(ids) // 2) + [1] * (len(ids) - len(ids) // 2)
    return TokenizedBranch(input_ids=ids, loss_mask=mask, score_index=score)


def random_pairs(n: int, *, seed: int = 0, min_len: int = 3, max_len: int = 24, eos: int | None = None):
    """Pairs of varying length; when `eos` is given every branch ends with it (pad == eos cases)."""
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        prompt = [rng.randrange(4, VOCAB) for _ in range(rng.randint(1, max_len // 2))]

        def completion(prompt: list[int] = prompt) -> list[int]:
            ids = prompt + [rng.randrange(4, VOCAB) for _ in range(rng.randint(min_len, max_len // 2))]
            return [*ids[: max_len - 1], eos] if eos is not None else ids[:max_len]

        pairs.append(
            TokenizedPair(
                pair_id=f"p{i}",
                chosen=branch(completion(), trailing=i % 2),
                rejected=branch(completion()),
                margin=None,
                subset="a" if i % 2 else "b",
            )
        )
    return pairs


def tiny_reward_model(name: str = "tiny-llama", seed: int = 0):
    from rewardplane.models.reward_model import RewardModel, build_backbone

    torch.manual_seed(seed)
    return RewardModel(build_backbone({"tiny": name}, vocab_size=VOCAB)).eval()


def train_config(run_dir, **sections):
    """A TrainConfig for tiny CPU runs; `sections` maps section name to a dict of overrides."""
    from rewardplane.train.config import TrainConfig, from_dict

    base = {
        "model": {"tiny": "tiny-llama"},
        "optim": {"lr": 1e-3, "warmup_steps": 0, "schedule": "constant"},
        "run": {
            "run_dir": str(run_dir),
            "max_steps": 4,
            "global_batch_pairs": 8,
            "layout": "packed",
            "progress": False,
            "eval_batch_size": 4,
            "keep_last": 3,
        },
        "data": {"max_length": 64},
    }
    for name, values in sections.items():
        base.setdefault(name, {}).update(values)
    return from_dict(TrainConfig, base)


def make_trainer(cfg, pairs=None, *, eval_pairs=None, train_pairs_sha256="data-a", info=None):
    from rewardplane.data.synth import builtin_tokenizer
    from rewardplane.train.loop import EvalSet, Trainer
    from rewardplane.train.recipe import build_objective

    pairs = pairs if pairs is not None else random_pairs(32, seed=11, max_len=20)
    eval_set = EvalSet(eval_pairs, "probe-sha") if eval_pairs else None
    return Trainer(
        cfg,
        build_objective(cfg),
        train_pairs=pairs,
        tokenizer=builtin_tokenizer(),
        train_pairs_sha256=train_pairs_sha256,
        eval_set=eval_set,
        info=info,
    )


def train_tiny_checkpoint(root, tok, *overrides: str):
    """A tiny-llama reward model trained for one step on the synthetic pairs with tokenizer `tok`
    (saved to `root/tok`), run under `root/run`: its checkpoint directory. `overrides` are dotted
    config overrides applied after the defaults (a later one wins)."""
    from rewardplane.train.config import load_config
    from rewardplane.train.recipe import run

    tok.save_pretrained(root / "tok")
    cfg = load_config(
        None,
        [
            "model.tiny=tiny-llama",
            f"data.tokenizer={root / 'tok'}",
            "data.synth={train_rows: 16, eval_rows: 4, seed: 0}",
            "data.max_length=128",
            "data.max_completion_length=64",
            f"run.run_dir={root / 'run'}",
            "run.max_steps=1",
            "run.global_batch_pairs=8",
            "run.progress=false",
            *overrides,
        ],
    )
    return run(cfg).checkpoint


def tiny_rm_argv(run, steps: int, *extra: str) -> list[str]:
    """`rewardplane train rm` arguments for a tiny-llama run of `steps` steps on 16 synthetic pairs
    (seconds on a CPU); `extra` overrides come last and win."""
    return [
        "train",
        "rm",
        "model.tiny=tiny-llama",
        "data.synth={train_rows: 16, eval_rows: 4}",
        "data.max_length=96",
        f"run.run_dir={run}",
        f"run.max_steps={steps}",
        "run.global_batch_pairs=8",
        "run.progress=false",
        *extra,
    ]
