"""The reward-model objective: Bradley–Terry on scalar scores, for training and for evaluation.

Training: `RewardModelObjective` builds the scalar-head model (`rewardplane.models.reward_model`),
turns a micro-batch into the per-pair Bradley–Terry loss (TRL's optional centring term and
margins included), writes and reloads checkpoints and refuses to resume another objective's.

Evaluation: `load_scorer` loads a saved reward model (a rewardplane checkpoint or an HF
`*ForSequenceClassification` directory) and scores pairs with the same `_score_batch` the
training loop's probe evaluation uses, through `rewardplane.objectives.base.score_in_batches`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rewardplane.core.errors import ConfigError, UsageError, reading
from rewardplane.core.hashing import sha256_file, sha256_json
from rewardplane.core.progress import Progress
from rewardplane.data.collate import Batch, Layout, collate
from rewardplane.data.records import TokenizedBranch, TokenizedPair
from rewardplane.data.tokenize import pad_token_id
from rewardplane.models.attention import VARLEN, packed_row_length
from rewardplane.models.config import ModelConfig
from rewardplane.models.loading import (
    OBJECTIVE,
    CheckpointError,
    load_model_weights,
    load_reward_model,
    torch_dtype,
    write_model_files,
)
from rewardplane.models.packed_scoring import score_sequence_chunks, varlen_supported
from rewardplane.models.reward_model import RewardModel, build_backbone, last_token_parts, model_spec
from rewardplane.objectives.base import (
    MicroBatchOutput,
    PairScorer,
    PairScores,
    Sections,
    TrainPairs,
    check_objective,
    score_in_batches,
    tokenisation_record,
)
from rewardplane.objectives.losses import bradley_terry, center_rewards_penalty
from rewardplane.objectives.reward_model_settings import RewardModelSettings  # the `loss:` section

ROLE = "reward_model"


def _score_batch(model: nn.Module, batch: Batch, pairs: Sequence[TokenizedPair]):
    """One forward over both branches: (chosen, rejected) scores; the loss comes from the margin."""
    scores = model(batch)
    return scores[: len(pairs)], scores[len(pairs) :], None


def score_pairs(
    model: nn.Module,
    pairs: Sequence[TokenizedPair],
    batch_size: int,
    layout: Layout = "right",
    *,
    pad_token_id: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Score every pair with a reward model in eval mode: float64 (chosen, rejected), input order."""
    chosen, rejected, _ = score_in_batches(
        model, pairs, batch_size, _score_batch, layout=layout, pad_token_id=pad_token_id
    )
    return chosen, rejected


DEFAULT_MAX_BATCH_TOKENS = 65536
"""Tokens per evaluation forward: the packed stream, or rows × longest row of a padded bucket."""


def load_scorer(
    path: str | Path,
    *,
    device: str,
    reference_path: str | Path | None = None,
    dtype: str = "fp32",
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
) -> PairScorer:
    """A rewardplane reward-model checkpoint or an HF `*ForSequenceClassification` dir (num_labels 1).

    Decoders are scored branch by branch through `models/packed_scoring.score_sequences`, the
    path `rewardplane serve` scores text on: each branch cut after the token its score is read at
    (nothing after it can change a causal model's score there), then packed `rk_varlen` forwards
    with shared prompts computed once on CUDA in bf16/fp16, length-sorted padded buckets
    elsewhere. Encoders, which see the tokens after the read position, keep `score_in_batches`.
    `dtype` casts the backbone (a rewardplane head stays fp32).
    """
    if reference_path is not None:
        raise UsageError(f"--reference applies to DPO policies only; {path} is not a DPO checkpoint")
    model, tokenizer, metadata = load_reward_model(path, device=device, dtype=torch_dtype(dtype))
    pad = pad_token_id(tokenizer)
    backbone, head = last_token_parts(model)

    def score(pairs: list[TokenizedPair], batch_size: int, progress: Progress | None = None) -> PairScores:
        if backbone is None:
            return score_in_batches(
                model, pairs, batch_size, _score_batch, pad_token_id=pad, progress=progress
            )
        values = score_branches([p.chosen for p in pairs] + [p.rejected for p in pairs], progress, per_unit=2)
        return values[: len(pairs)], values[len(pairs) :], None

    if backbone is None:
        scoring = {"path": "padded pairs (model forward)", "attention": "padded", "batching": "--batch-size"}
        return PairScorer(metadata.get("objective", OBJECTIVE), tokenizer, metadata, score, None, scoring)
    varlen = varlen_supported(backbone.config, device, torch_dtype(dtype))
    if varlen:
        backbone.set_attn_implementation(VARLEN)
    scoring = {
        "path": "packed varlen, shared prompts" if varlen else "padded, length-sorted buckets",
        "attention": "varlen" if varlen else "padded",
        "prefix_sharing": varlen,
        "max_batch_tokens": max_batch_tokens,
    }
    read_at = _read_position(model, tokenizer)

    @torch.inference_mode()
    def score_branch_chunks(
        chunks: Iterable[Sequence[TokenizedBranch]], progress: Progress | None = None, per_unit: int = 1
    ) -> np.ndarray:
        """Scores per branch, in the order the chunks bring them; each chunk's forwards are
        queued as it arrives (`score_sequence_chunks`); `progress` advances by one per
        `per_unit` branches scored."""
        values, tokens = score_sequence_chunks(
            ([b.input_ids[: read_at(b) + 1] for b in chunk] for chunk in chunks),
            varlen=varlen, max_batch_tokens=max_batch_tokens, backbone=backbone, head=head,
            pad_token_id=pad, device=device, share_prefixes=varlen,
            on_scored=None if progress is None else _units(progress, per_unit),
        )  # fmt: skip
        scoring.update({f"{k}_tokens": v for k, v in tokens.items()})
        return values.numpy().astype(np.float64)

    def score_branches(
        branches: list[TokenizedBranch], progress: Progress | None = None, per_unit: int = 1
    ) -> np.ndarray:
        """Scores per branch; `progress` advances by one per `per_unit` branches scored."""
        return score_branch_chunks([branches], progress, per_unit)

    return PairScorer(
        metadata.get("objective", OBJECTIVE), tokenizer, metadata, score, score_branches, scoring,
        score_branch_chunks,
    )  # fmt: skip


def _units(progress: Progress, per_unit: int) -> Callable[[int], None]:
    """A `score_sequences` callback (sequences scored) advancing `progress` in whole units."""
    done = [0, 0]  # sequences scored, units reported

    def advance(n: int) -> None:
        done[0] += n
        units = done[0] // per_unit
        progress.update(units - done[1])
        done[1] = units

    return advance


def _read_position(model: nn.Module, tokenizer: Any):
    """branch → the token its score is read at, as the model's own forward reads it: a rewardplane
    head at `score_index` (stepped back over trailing template whitespace for end-of-turn
    checkpoints), an HF classifier at the last token that is not its pad token."""
    if isinstance(model, RewardModel):
        if model._trailing_ids is None:
            return lambda branch: branch.score_index

        def stepped(branch: TokenizedBranch) -> int:
            ids = torch.tensor([branch.input_ids])
            zero, index = torch.zeros(1, dtype=torch.long), torch.tensor([branch.score_index])
            return int(model.read_cols(ids, zero, index)[0])

        return stepped
    pad = model.config.pad_token_id

    def last_not_pad(branch: TokenizedBranch) -> int:
        ids = branch.input_ids
        k = len(ids) - 1
        while k > 0 and ids[k] == pad:
            k -= 1
        return k

    return last_not_pad


def _base_identity(m: ModelConfig, backbone_config: Any) -> dict[str, Any]:
    """What the model started from: a name/path plus a content hash, recorded in every checkpoint."""
    if m.init_from:
        src = Path(m.init_from)
        files = sorted(src.glob("*.safetensors"))
        return {"init_from": str(src), "sha256": sha256_file(files[0]) if len(files) == 1 else None}
    if m.path and not m.random_init:
        src = Path(m.path)
        files = [src / m.gguf_file] if m.gguf_file else sorted(src.glob("*.safetensors"))
        return {"path": str(src), "sha256": sha256_file(files[0]) if len(files) == 1 else None}
    return {
        "random_init": m.tiny or backbone_config.model_type,
        "sha256": sha256_json(backbone_config.to_diff_dict()),
    }


def _from_init(path: str) -> RewardModel:
    """Start from an existing reward model: a rewardplane RM checkpoint or an HF seqcls directory."""
    from transformers import AutoModelForSequenceClassification

    from rewardplane.models.loading import is_checkpoint, load_rewardplane_model

    if is_checkpoint(path):
        return load_rewardplane_model(path)[0]
    with reading(path, "model", code="bad_model_dir"):
        hf = AutoModelForSequenceClassification.from_pretrained(
            path, local_files_only=True, dtype=torch.float32
        )
    head = getattr(hf, "score", None)
    if not isinstance(head, nn.Linear) or head.bias is not None or head.out_features != 1:
        raise CheckpointError(
            f"{path}: {type(hf).__name__} has no bias-free single-output `score` head (e.g. BERT pools the"
            " first token through a pooler); it can be scored with load_reward_model but not trained here",
            code="wrong_head",
        )
    model = RewardModel(hf.base_model)
    model.head.weight.data.copy_(head.weight.data.float())
    return model


class RewardModelObjective:
    """Bradley–Terry on (chosen, rejected) scores, TRL's optional centring term, optional margins.

    Built from its typed sections (`model`, `data.max_length`, `run.layout`, and its own `loss:`
    settings); the training pairs are the loop's business, so `pairs` is not read.
    """

    name = OBJECTIVE
    role = ROLE

    def __init__(self, sections: Sections[RewardModelSettings], pairs: TrainPairs | None = None) -> None:
        self.model_cfg, self.data_cfg, self.run = sections.model, sections.data, sections.run
        self.settings = sections.settings
        self.pad_token_id = 0
        self._metadata: dict[str, Any] = {}
        self._backbone_config = None

    def build_model(self, tokenizer: Any) -> RewardModel:
        if self.model_cfg.lora is not None:
            raise ConfigError(
                "model.lora: adapters are for DPO policies; reward models train every parameter"
            )
        if self.model_cfg.init_from:
            model = _from_init(self.model_cfg.init_from)
        else:
            model = RewardModel(build_backbone(model_spec(self.model_cfg), vocab_size=len(tokenizer)))
        vocab = model.config.vocab_size
        if len(tokenizer) > vocab:
            raise ConfigError(
                f"tokenizer has {len(tokenizer)} tokens but the backbone's vocabulary is {vocab}"
            )
        self.pad_token_id = pad_token_id(tokenizer)
        self._backbone_config = model.config
        self._metadata = {
            "objective": self.name,
            "role": self.role,
            "head_type": RewardModel.head_type,
            "base_model": _base_identity(self.model_cfg, model.config),
            **tokenisation_record(tokenizer, model.config, self.data_cfg.max_length),
        }
        return model

    def prepare(self, device: torch.device) -> None:
        """A reward model needs nothing besides itself."""

    def micro_batch(
        self, model: nn.Module, pairs: Sequence[TokenizedPair], device: torch.device
    ) -> MicroBatchOutput:
        batch = collate(
            pairs,
            layout=self.run.layout,
            pad_token_id=self.pad_token_id,
            max_length=self.data_cfg.max_length,
            row_length=packed_row_length(self._backbone_config, self.data_cfg.max_length),
        ).to(device)
        chosen, rejected, _ = _score_batch(model, batch, pairs)
        margin = None
        if self.settings.use_margin and any(p.margin is not None for p in pairs):
            margin = torch.tensor([p.margin or 0.0 for p in pairs], dtype=chosen.dtype, device=chosen.device)
        loss = bradley_terry(chosen, rejected, margin)
        coefficient = self.settings.center_rewards_coefficient
        if coefficient:
            loss = loss + center_rewards_penalty(chosen, rejected, coefficient)
        return MicroBatchOutput(
            loss_sum=loss.sum(),
            chosen=chosen.detach(),
            rejected=rejected.detach(),
            num_tokens=batch.num_tokens,
            num_slots=batch.num_slots,
        )

    def score(self, model: nn.Module, pairs: Sequence[TokenizedPair], batch_size: int) -> PairScores:
        return score_in_batches(
            model, pairs, batch_size, _score_batch, layout=self.run.layout, pad_token_id=self.pad_token_id
        )

    def write_model(self, directory: Path, state_dict: dict[str, torch.Tensor], tokenizer: Any) -> str:
        return write_model_files(directory, state_dict, self._backbone_config, tokenizer)

    def load_model_state(self, model: nn.Module, directory: Path) -> None:
        load_model_weights(model, directory)

    def checkpoint_metadata(self) -> dict[str, Any]:
        return dict(self._metadata)

    def validate_resume(self, metadata: dict[str, Any]) -> None:
        check_objective(metadata, self.name, self.role, "reward-model")
        if metadata.get("head_type") != RewardModel.head_type:
            raise CheckpointError(
                f"checkpoint head {metadata.get('head_type')!r}, this run trains {RewardModel.head_type!r}",
                code="wrong_head",
            )
