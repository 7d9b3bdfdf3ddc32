"""A toy objective for `tests/objectives/test_registry.py`: what a new objective's module holds.

A bag-of-tokens scorer (one weight per vocabulary entry, a branch's score is the mean weight of
its tokens) trained with a hinge loss, max(0, margin − (chosen − rejected)). Everything
rewardplane needs of it is here and in one registry row; nothing else in the package names it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import Field
from safetensors.torch import load_file, save_file
from torch import nn

from rewardplane.core.config import ConfigModel
from rewardplane.core.hashing import sha256_file
from rewardplane.data.records import TokenizedPair
from rewardplane.objectives.base import (
    MicroBatchOutput,
    PairScorer,
    PairScores,
    Sections,
    TrainPairs,
    check_objective,
)

NAME = "toy"
WEIGHTS = "toy.safetensors"


class ToySettings(ConfigModel):
    """The `toy:` config section."""

    margin: float = Field(1.0, gt=0)  # the hinge's margin


class BagScorer(nn.Module):
    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, branches: Sequence[Sequence[int]]) -> torch.Tensor:
        device = self.weight.device
        return torch.stack([self.weight[torch.tensor(list(ids), device=device)].mean() for ids in branches])


def _scores(model: nn.Module, pairs: Sequence[TokenizedPair]) -> tuple[torch.Tensor, torch.Tensor]:
    return model([p.chosen.input_ids for p in pairs]), model([p.rejected.input_ids for p in pairs])


class ToyObjective:
    name = NAME
    role = "reward_model"

    def __init__(self, sections: Sections[ToySettings], pairs: TrainPairs) -> None:
        self.settings = sections.settings
        self.max_length = sections.data.max_length
        self._metadata: dict[str, Any] = {}

    def build_model(self, tokenizer: Any) -> nn.Module:
        self._metadata = {
            "objective": self.name,
            "role": self.role,
            "head_type": "bag",
            "margin": self.settings.margin,
            "max_length": self.max_length,
        }
        return BagScorer(len(tokenizer))

    def prepare(self, device: torch.device) -> None:
        """Nothing besides the model."""

    def micro_batch(self, model: nn.Module, pairs: Sequence[TokenizedPair], device: torch.device):
        chosen, rejected = _scores(model, pairs)
        loss = torch.clamp(self.settings.margin - (chosen - rejected), min=0)
        tokens = sum(p.num_tokens for p in pairs)
        return MicroBatchOutput(loss.sum(), chosen.detach(), rejected.detach(), tokens, tokens)

    def score(self, model: nn.Module, pairs: Sequence[TokenizedPair], batch_size: int) -> PairScores:
        with torch.no_grad():
            chosen, rejected = _scores(model, pairs)
        return chosen.double().cpu().numpy(), rejected.double().cpu().numpy(), None

    def write_model(self, directory: Path, state_dict: dict[str, torch.Tensor], tokenizer: Any) -> str:
        save_file({k: v.contiguous() for k, v in state_dict.items()}, str(Path(directory) / WEIGHTS))
        tokenizer.save_pretrained(directory)
        return sha256_file(Path(directory) / WEIGHTS)

    def load_model_state(self, model: nn.Module, directory: Path) -> None:
        model.load_state_dict(load_file(str(Path(directory) / WEIGHTS)))

    def checkpoint_metadata(self) -> dict[str, Any]:
        return dict(self._metadata)

    def validate_resume(self, metadata: dict[str, Any]) -> None:
        check_objective(metadata, self.name, self.role, "toy")


def load_scorer(path, *, device: str, reference_path=None, dtype: str = "fp32", max_batch_tokens=None):
    """A saved toy checkpoint: pairs → (chosen, rejected) mean-token weights."""
    from transformers import AutoTokenizer

    from rewardplane.models.loading import read_verified_metadata

    meta = read_verified_metadata(path)
    weights = load_file(str(Path(path) / WEIGHTS))["weight"]
    model = BagScorer(len(weights))
    model.weight.data.copy_(weights)

    def score(pairs, batch_size, progress=None) -> PairScores:
        with torch.no_grad():
            chosen, rejected = _scores(model, pairs)
        if progress is not None:
            progress.update(len(pairs))
        return chosen.double().numpy(), rejected.double().numpy(), None

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return PairScorer(NAME, tokenizer, meta, score, None, {"path": "bag of tokens"})


def export(checkpoint: Path, out: Path) -> dict[str, Any]:
    """The weights as one JSON list: the toy's "standard format"."""
    weights = load_file(str(Path(checkpoint) / WEIGHTS))["weight"]
    Path(out).mkdir(parents=True)
    (Path(out) / "weights.json").write_text(json.dumps(np.asarray(weights).tolist()))
    return {"checkpoint": str(checkpoint), "out": str(out), "format": "toy-json"}
