"""Reward-model recipe: Bradley–Terry objective, data preparation and `run(config)`.

`rewardkit train rm --config cfg.yaml [key=value ...]` and `make demo` both end up in `run`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rewardkit.core.errors import ConfigError
from rewardkit.core.hashing import sha256_file, sha256_json
from rewardkit.data.collate import collate
from rewardkit.data.records import PreferencePair, TokenizedPair
from rewardkit.models.attention import packed_row_length
from rewardkit.models.loading import OBJECTIVE, CheckpointError, write_model_files
from rewardkit.models.reward_model import RewardModel, build_backbone, model_spec, score_pairs
from rewardkit.objectives.base import MicroBatchOutput, check_objective
from rewardkit.objectives.losses import bradley_terry, center_rewards_penalty
from rewardkit.train.checkpoint import load_model_weights
from rewardkit.train.config import DataConfig, TrainConfig
from rewardkit.train.loop import EvalSet, RunResult, Trainer

log = logging.getLogger("rewardkit.train")


def _base_identity(cfg: TrainConfig, backbone_config: Any) -> dict[str, Any]:
    """What the model started from: a name/path plus a content hash, recorded in every checkpoint."""
    m = cfg.model
    if m.init_from:
        src = Path(m.init_from)
        files = sorted(src.glob("*.safetensors"))
        return {"init_from": str(src), "sha256": sha256_file(files[0]) if len(files) == 1 else None}
    if m.path:
        src = Path(m.path)
        files = [src / m.gguf_file] if m.gguf_file else sorted(src.glob("*.safetensors"))
        return {"path": str(src), "sha256": sha256_file(files[0]) if len(files) == 1 else None}
    return {
        "random_init": m.tiny or backbone_config.model_type,
        "sha256": sha256_json(backbone_config.to_diff_dict()),
    }


def _from_init(path: str) -> RewardModel:
    """Start from an existing reward model: a rewardkit RM checkpoint or an HF seqcls directory."""
    from transformers import AutoModelForSequenceClassification

    from rewardkit.models.loading import METADATA_FILE, load_rewardkit_model

    if (Path(path) / METADATA_FILE).is_file():
        return load_rewardkit_model(path)[0]
    hf = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True, dtype=torch.float32)
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
    """Bradley–Terry on (chosen, rejected) scores, TRL's optional centring term, optional margins."""

    name = OBJECTIVE
    role = "reward_model"

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.pad_token_id = 0
        self._metadata: dict[str, Any] = {}
        self._backbone_config = None

    def build_model(self, tokenizer: Any) -> RewardModel:
        from rewardkit.data.tokenize import template_sha256, tokenizer_sha256

        if self.cfg.model.lora is not None:
            raise ConfigError(
                "model.lora: adapters are for DPO policies; reward models train every parameter"
            )
        if self.cfg.model.init_from:
            model = _from_init(self.cfg.model.init_from)
        else:
            model = RewardModel(build_backbone(model_spec(self.cfg.model), vocab_size=len(tokenizer)))
        vocab = model.config.vocab_size
        if len(tokenizer) > vocab:
            raise ConfigError(
                f"tokenizer has {len(tokenizer)} tokens but the backbone's vocabulary is {vocab}"
            )
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_token_id = int(pad or 0)
        self._backbone_config = model.config
        self._metadata = {
            "objective": self.name,
            "role": self.role,
            "head_type": RewardModel.head_type,
            "base_model": _base_identity(self.cfg, model.config),
            "tokenizer_sha256": tokenizer_sha256(tokenizer),
            "template_sha256": template_sha256(tokenizer),
            "attn_implementation": model.config._attn_implementation,
            "max_length": self.cfg.data.max_length,
        }
        return model

    def prepare(self, device: torch.device) -> None:
        """A reward model needs nothing besides itself."""

    def micro_batch(
        self, model: nn.Module, pairs: Sequence[TokenizedPair], device: torch.device
    ) -> MicroBatchOutput:
        batch = collate(
            pairs,
            layout=self.cfg.run.layout,
            pad_token_id=self.pad_token_id,
            max_length=self.cfg.data.max_length,
            row_length=packed_row_length(self._backbone_config, self.cfg.data.max_length),
        ).to(device)
        scores = model(batch)
        n = len(pairs)
        chosen, rejected = scores[:n], scores[n:]
        margin = None
        if self.cfg.loss.use_margin and any(p.margin is not None for p in pairs):
            margin = torch.tensor([p.margin or 0.0 for p in pairs], dtype=scores.dtype, device=scores.device)
        loss = bradley_terry(chosen, rejected, margin)
        coefficient = self.cfg.loss.center_rewards_coefficient
        if coefficient:
            loss = loss + center_rewards_penalty(chosen, rejected, coefficient)
        return MicroBatchOutput(
            loss_sum=loss.sum(),
            chosen=chosen.detach(),
            rejected=rejected.detach(),
            num_tokens=batch.num_tokens,
            num_slots=batch.num_slots,
        )

    def score(self, model: nn.Module, pairs: Sequence[TokenizedPair], batch_size: int):
        chosen, rejected = score_pairs(
            model, pairs, batch_size, layout=self.cfg.run.layout, pad_token_id=self.pad_token_id
        )
        return chosen, rejected, None

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


# ---- data ---------------------------------------------------------------------------------
@dataclass
class PreparedData:
    train: list[TokenizedPair]
    eval: list[TokenizedPair]
    tokenizer: Any
    data_sha256: str
    probe_sha256: str | None
    rejected: dict[str, int]


def _load_tokenizer(cfg: TrainConfig):
    from rewardkit.data.tokenize import load_tokenizer

    spec = cfg.data.tokenizer
    if spec == "model":
        from transformers import AutoTokenizer

        source = cfg.model.path or cfg.model.init_from
        if not source:
            raise ConfigError("data.tokenizer=model needs model.path or model.init_from")
        kwargs = {"gguf_file": cfg.model.gguf_file} if cfg.model.gguf_file and cfg.model.path else {}
        return AutoTokenizer.from_pretrained(source, local_files_only=True, **kwargs)
    return load_tokenizer(spec)


def _read(path: str, counts: Counter) -> list[PreferencePair]:
    from rewardkit.data.reader import iter_pairs
    from rewardkit.data.reasons import Rejection

    pairs = []
    for item in iter_pairs(path):
        if isinstance(item, Rejection):
            counts[item.reason] += 1
        else:
            pairs.append(item)
    return pairs


def _tokenize(pairs: list[PreferencePair], tokenizer, settings, counts: Counter) -> list[TokenizedPair]:
    from rewardkit.data.reasons import Rejection
    from rewardkit.data.tokenize import tokenize_pair

    out = []
    for pair in pairs:
        try:
            out.append(tokenize_pair(pair, tokenizer, settings))
        except Rejection as rejection:
            counts[rejection.reason] += 1
    return out


def prepare_data(cfg: TrainConfig) -> PreparedData:
    """Read, validate and tokenise the train / eval pairs (rejections are counted by reason)."""
    import json

    from rewardkit.data.normalize import normalize_row
    from rewardkit.data.probe import check_probe, freeze_probe
    from rewardkit.data.tokenize import TokenizeSettings

    data: DataConfig = cfg.data
    tokenizer = _load_tokenizer(cfg)
    settings = TokenizeSettings(
        max_length=data.max_length,
        max_completion_length=data.max_completion_length,
        truncation=data.truncation,
    )
    counts: Counter = Counter()
    if data.synth is not None:
        from rewardkit.data.synth import generate_rows

        if data.train or data.eval:
            raise ConfigError("data: give either synth or train/eval files, not both")
        rows = generate_rows(data.synth.train_rows + data.synth.eval_rows, seed=data.synth.seed)
        raw = [normalize_row(row) for row in rows]
        train_raw, eval_raw = raw[: data.synth.train_rows], raw[data.synth.train_rows :]
    elif data.train:
        train_raw = _read(data.train, counts)
        eval_raw = _read(data.eval, counts) if data.eval else []
    else:
        raise ConfigError("data: set data.train (a JSONL/Parquet file) or data.synth")
    train = _tokenize(train_raw, tokenizer, settings, counts)
    evaluation = _tokenize(eval_raw, tokenizer, settings, counts)
    if counts:
        log.warning("rejected pairs by reason: %s", dict(sorted(counts.items())))
    if not train:
        raise ConfigError("no training pairs left after validation")
    probe_sha = None
    if evaluation:
        if data.probe:
            probe = json.loads(Path(data.probe).read_text())
            check_probe(probe, evaluation, tokenizer=tokenizer, settings=settings)
        probe_sha = freeze_probe(evaluation, tokenizer, settings)["tokens_sha256"]
    return PreparedData(
        train=train,
        eval=evaluation,
        tokenizer=tokenizer,
        data_sha256=sha256_json(freeze_probe(train, tokenizer, settings)),
        probe_sha256=probe_sha,
        rejected=dict(counts),
    )


def run(cfg: TrainConfig, *, resume: str | None = None, allow_new_data: bool = False) -> RunResult:
    """Prepare data, train, checkpoint and evaluate; `resume` is a checkpoint dir or "auto"."""
    from rewardkit.train.checkpoint import latest_checkpoint

    data = prepare_data(cfg)
    eval_set = EvalSet(data.eval, data.probe_sha256) if data.eval else None
    trainer = Trainer(
        cfg,
        RewardModelObjective(cfg),
        train_pairs=data.train,
        tokenizer=data.tokenizer,
        data_sha256=data.data_sha256,
        eval_set=eval_set,
    )
    if resume == "auto":
        found = latest_checkpoint(Path(cfg.run.run_dir) / "checkpoints")
        resume = str(found) if found else None
    if resume:
        trainer.resume(resume, allow_new_data=allow_new_data)
    return trainer.fit()
