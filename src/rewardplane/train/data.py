"""Training data: the `data:` section through the one data pipeline, for every objective.

Reward-model and DPO runs train on the same prepared data: train and eval pairs read,
normalised, validated and tokenised by `rewardplane.data.pipeline` (rejections counted by reason,
as `rewardplane data validate` counts them), the eval pairs checked against a frozen probe when
one is given, and the hashes that identify both in checkpoints and evaluation artifacts.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rewardplane.core.errors import ConfigError
from rewardplane.core.hashing import sha256_json
from rewardplane.data.pipeline import Source, Summary, tokenize_source
from rewardplane.data.probe import check_probe, freeze_probe
from rewardplane.data.records import TokenizedPair
from rewardplane.data.tokenize import TokenizeSettings, load_tokenizer
from rewardplane.train.config import TrainConfig

log = logging.getLogger("rewardplane.train")


@dataclass
class PreparedData:
    train: list[TokenizedPair]
    eval: list[TokenizedPair]
    tokenizer: Any
    data_sha256: str
    probe_sha256: str | None
    rejected: dict[str, int]


def training_tokenizer(cfg: TrainConfig):
    """`data.tokenizer` (`builtin`, a local directory, or `model`, the backbone's own), with
    `data.pad_token` set as its pad token when given."""
    tokenizer = _load_training_tokenizer(cfg)
    token = cfg.data.pad_token
    if token is not None:
        vocab = tokenizer.get_vocab()
        if token not in vocab:
            raise ConfigError(f"data.pad_token {token!r} is not a token of the tokenizer's vocabulary")
        import copy

        tokenizer = copy.deepcopy(tokenizer)  # `builtin` is a shared, cached object
        tokenizer.pad_token = token
    return tokenizer


def _load_training_tokenizer(cfg: TrainConfig):
    spec = cfg.data.tokenizer
    if spec == "model":
        from transformers import AutoTokenizer

        source = cfg.model.path or cfg.model.init_from
        if not source:
            raise ConfigError("data.tokenizer=model needs model.path or model.init_from")
        kwargs = {"gguf_file": cfg.model.gguf_file} if cfg.model.gguf_file and cfg.model.path else {}
        return AutoTokenizer.from_pretrained(source, local_files_only=True, **kwargs)
    return load_tokenizer(spec)


def _warn_if_pad_is_scored(tokenizer, pairs: list[TokenizedPair]) -> None:
    """Training is exact with pad == the scored token (positions are explicit), but a Hugging Face
    export finds the last non-pad token and would skip it: say so now, naming the setting."""
    from rewardplane.data.tokenize import pad_token_id

    pad = pad_token_id(tokenizer)
    if any(b.input_ids[b.score_index] == pad for p in pairs[:256] for b in (p.chosen, p.rejected)):
        log.warning(
            "the pad token (id %d, %r) is the token scores are read at: `rewardplane export hf` will refuse"
            " this model; set data.pad_token to another token of the vocabulary (as TRL's"
            " RewardConfig.pad_token)",
            pad,
            tokenizer.convert_ids_to_tokens(pad),
        )


def _sources(cfg: TrainConfig) -> tuple[Source, Source]:
    """(train, eval) sources: the files, or the synthetic task's rows split in two."""
    data = cfg.data
    if data.synth is not None:
        from rewardplane.data.synth import generate_rows

        if data.train or data.eval:
            raise ConfigError("data: give either synth or train/eval files, not both")
        rows = generate_rows(data.synth.train_rows + data.synth.eval_rows, seed=data.synth.seed)
        return rows[: data.synth.train_rows], rows[data.synth.train_rows :]
    if data.train:
        return data.train, data.eval or []
    raise ConfigError("data: set data.train (a JSONL/Parquet file) or data.synth")


def prepare_data(cfg: TrainConfig) -> PreparedData:
    """Read, validate and tokenise the train / eval pairs (rejections are counted by reason)."""
    data = cfg.data
    tokenizer = training_tokenizer(cfg)
    settings = TokenizeSettings(
        max_length=data.max_length,
        max_completion_length=data.max_completion_length,
        truncation=data.truncation,
        score_position=data.score_position,
        plain_text=data.plain_text,
    )
    train_source, eval_source = _sources(cfg)
    summary = Summary()
    train = tokenize_source(train_source, tokenizer, settings, summary)
    evaluation = tokenize_source(eval_source, tokenizer, settings, summary)
    rejected = summary.nonzero()
    if rejected:
        log.warning("rejected pairs by reason: %s", rejected)
    _warn_if_pad_is_scored(tokenizer, train)
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
        rejected=rejected,
    )
