"""`transformer_blocks`: the units FSDP2 shards and `run.compile` compiles, whatever wraps them."""

from __future__ import annotations

from transformers import AutoModel, AutoModelForCausalLM

from rewardplane.models.tiny import tiny_config
from rewardplane.train.distributed import transformer_blocks


def test_blocks_are_found_in_causal_lms_encoders_reward_models_and_peft_wrappers():
    from peft import LoraConfig, get_peft_model

    from rewardplane.models.reward_model import RewardModel

    causal = AutoModelForCausalLM.from_config(tiny_config("tiny-llama", vocab_size=64))
    assert [type(b).__name__ for b in transformer_blocks(causal)] == ["LlamaDecoderLayer"] * 2
    assert transformer_blocks(causal) == list(causal.model.layers)
    adapted = get_peft_model(causal, LoraConfig(r=2, target_modules=["q_proj"]))
    assert transformer_blocks(adapted) == list(causal.model.layers)
    encoder = AutoModel.from_config(tiny_config("tiny-bert", vocab_size=64))
    assert [type(b).__name__ for b in transformer_blocks(encoder)] == ["BertEmbeddings"] + ["BertLayer"] * 2
    reward = RewardModel(AutoModel.from_config(tiny_config("tiny-llama", vocab_size=64)))
    assert transformer_blocks(reward) == list(reward.backbone.layers)
