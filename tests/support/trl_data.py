"""TRL's own dataset preparation, called directly: the token ids its trainers would train on.

`RewardTrainer._prepare_dataset` and `DPOTrainer._prepare_dataset` are the code TRL runs on a
dataset before training (add EOS to plain-text rows, extract the prompt, tokenise, split the
prompt off). Neither needs a model; the DPO one reads only `self._tokenizer`, so both run here
without building a trainer.
"""

from __future__ import annotations

import tempfile
from types import SimpleNamespace


def _args(config_class):
    return config_class(
        output_dir=tempfile.mkdtemp(prefix="rk-trl-"),
        max_length=None,
        dataset_num_proc=None,
        report_to=[],
        use_cpu=True,
        bf16=False,
    )


def trl_reward_ids(rows: list[dict], tokenizer) -> list[tuple[list[int], list[int]]]:
    """(chosen_ids, rejected_ids) per row, as TRL's RewardTrainer tokenises them."""
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    dataset = RewardTrainer._prepare_dataset(
        None, Dataset.from_list(rows), tokenizer, _args(RewardConfig), "t"
    )
    return [(list(x["chosen_ids"]), list(x["rejected_ids"])) for x in dataset]


def trl_dpo_ids(rows: list[dict], tokenizer) -> list[tuple[list[int], list[int], list[int]]]:
    """(prompt_ids, chosen completion ids, rejected completion ids) per row, as TRL's DPOTrainer splits them."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    trainer = SimpleNamespace(_tokenizer=tokenizer)
    dataset = DPOTrainer._prepare_dataset(trainer, Dataset.from_list(rows), tokenizer, _args(DPOConfig), "t")
    return [(list(x["prompt_ids"]), list(x["chosen_ids"]), list(x["rejected_ids"])) for x in dataset]
