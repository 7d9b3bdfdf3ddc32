"""Training data: the `data:` section through the one data pipeline, for every objective.

Reward-model and DPO runs train on the same prepared data: train and eval pairs read,
normalised, validated and tokenised by `rewardplane.data.pipeline` (rejections counted by reason,
as `rewardplane data validate` counts them), the eval pairs checked against a frozen probe when
one is given, and the hashes that identify both in checkpoints and evaluation artifacts. The
training pairs' content keys (`rewardplane.data.overlap`) go into every checkpoint, so any later
evaluation can count the pairs this model was trained on; the run's own eval pairs are counted
against them now.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rewardplane.core.errors import ConfigError, UsageError, reading
from rewardplane.core.hashing import sha256_json
from rewardplane.data.overlap import ContentHashes, Overlap, TrainingContent, overlap_line
from rewardplane.data.pipeline import Source, Summary, tokenize_source
from rewardplane.data.probe import ProbeMismatch, check_probe, freeze_probe
from rewardplane.data.records import TokenizedPair
from rewardplane.data.tokenize import TokenizeSettings, load_tokenizer
from rewardplane.train.config import BaseTrainConfig

log = logging.getLogger("rewardplane.train")


@dataclass
class PreparedData:
    train: list[TokenizedPair]
    eval: list[TokenizedPair]
    tokenizer: Any
    train_pairs_sha256: str
    probe_sha256: str | None
    rejected: dict[str, int]
    prepared_manifest_sha256: str | None = None  # `data.prepared`'s manifest.json, recorded in checkpoints
    train_content: TrainingContent | None = None
    eval_overlap: Overlap | None = None


def training_tokenizer(cfg: BaseTrainConfig):
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


def _load_training_tokenizer(cfg: BaseTrainConfig):
    spec = cfg.data.tokenizer
    if spec == "model":
        from transformers import AutoTokenizer

        source = cfg.model.path or cfg.model.init_from
        if not source:
            raise ConfigError("data.tokenizer=model needs model.path or model.init_from")
        kwargs = {"gguf_file": cfg.model.gguf_file} if cfg.model.gguf_file and cfg.model.path else {}
        with reading(source, "tokenizer", code="bad_model_dir"):
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


class PreparedMismatch(UsageError):
    """The run's tokenizer or settings are not the ones the prepared folder was validated with."""

    code = "prepared_mismatch"


def _prepared_fix(recorded: dict[str, Any], given: dict[str, Any], differ: list[str]) -> str:
    keys = " ".join(f"data.{key}={recorded.get(key)}" for key in differ)
    return f"train with the folder's settings ({keys}) or prepare the folder again with this run's"


def check_prepared(cfg: BaseTrainConfig, tokenizer, settings: TokenizeSettings) -> str | None:
    """`data.prepared`: its files as `rewardplane data prepare` wrote them, validated with this
    run's tokenizer and settings (the check a probe gets); the SHA-256 of its manifest.json."""
    from rewardplane.data.manifest import read_prepared
    from rewardplane.data.probe import check_tokenisation

    if cfg.data.prepared is None:
        return None
    manifest, manifest_sha256 = read_prepared(cfg.data.prepared)
    recorded = manifest.get("tokenizer")
    if recorded is None:  # prepared without --tokenizer: only the schema was validated
        log.info("data.prepared %s records no tokenizer; this run's tokenises it", cfg.data.prepared)
        return manifest_sha256
    where = f"data.prepared={cfg.data.prepared} (prepared with tokenizer {recorded.get('name')!r})"
    try:
        check_tokenisation(
            recorded,
            tokenizer,
            settings,
            labels=("prepared", "this run"),
            fix=_prepared_fix,
            error=PreparedMismatch,
        )
    except PreparedMismatch as exc:
        raise PreparedMismatch(f"{where}: {exc.message}") from None
    return manifest_sha256


def _sources(cfg: BaseTrainConfig) -> tuple[Source, Source]:
    """(train, eval) sources: a prepared folder's files, the files, or the synthetic task's rows
    split in two."""
    data = cfg.data
    if data.prepared is not None:
        if data.train or data.eval or data.synth is not None:
            raise ConfigError("data: give either prepared or train/eval files or synth, not two of them")
        return str(Path(data.prepared) / "train.jsonl"), str(Path(data.prepared) / "eval.jsonl")
    if data.synth is not None:
        from rewardplane.data.synth import generate_rows

        if data.train or data.eval:
            raise ConfigError("data: give either synth or train/eval files, not both")
        rows = generate_rows(data.synth.train_rows + data.synth.eval_rows, seed=data.synth.seed)
        return rows[: data.synth.train_rows], rows[data.synth.train_rows :]
    if data.train:
        return data.train, data.eval or []
    raise ConfigError("data: set data.train (a JSONL/Parquet file) or data.synth")


def check_local_paths(cfg: BaseTrainConfig) -> None:
    """Every path the config names exists here. A missing one is named as such, before transformers
    takes it for a Hub repo id and answers about repo names or huggingface.co (rewardplane never
    downloads anything)."""
    from rewardplane.data.reader import source_exists
    from rewardplane.data.tokenize import BUILTIN

    models = {"model.path": cfg.model.path, "model.init_from": cfg.model.init_from}
    if cfg.data.tokenizer not in (BUILTIN, "model"):
        models["data.tokenizer"] = cfg.data.tokenizer
    files = {
        "data.prepared": cfg.data.prepared,
        "data.train": cfg.data.train,
        "data.eval": cfg.data.eval,
        "data.probe": cfg.data.probe,
    }
    for key, value in models.items():
        if value and not Path(value).exists():
            raise UsageError(
                f"{key}={value}: no such local directory (models and tokenizers are read from local"
                " directories only; nothing is downloaded)",
                code="no_such_path",
            )
    for key, value in files.items():
        if value and not source_exists(value):
            raise UsageError(f"{key}={value}: no such file or directory", code="no_such_path")


def prepare_data(cfg: BaseTrainConfig) -> PreparedData:
    """Read, validate and tokenise the train / eval pairs (rejections are counted by reason)."""
    check_local_paths(cfg)
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
    manifest_sha256 = check_prepared(cfg, tokenizer, settings)  # before any pair is tokenised
    summary = Summary()
    train_keys, eval_keys = ContentHashes(), ContentHashes()
    train = tokenize_source(train_source, tokenizer, settings, summary, content=train_keys)
    evaluation = tokenize_source(eval_source, tokenizer, settings, summary, content=eval_keys)
    rejected = summary.nonzero()
    if rejected:
        log.warning("rejected pairs by reason: %s", rejected)
    _warn_if_pad_is_scored(tokenizer, train)
    if not train:
        raise ConfigError("no training pairs left after validation")
    probe_sha = None
    train_content = train_keys.record()
    eval_overlap = None
    if evaluation:
        if data.probe:
            probe = json.loads(Path(data.probe).read_text())
            try:
                check_probe(probe, evaluation, tokenizer=tokenizer, settings=settings)
            except ProbeMismatch as exc:
                raise ProbeMismatch(f"data.probe {data.probe}: {exc.message}") from None
        probe_sha = freeze_probe(evaluation, tokenizer, settings)["tokens_sha256"]
        eval_overlap = train_content.find(eval_keys)
        if eval_overlap.pairs:
            log.warning("%s", overlap_line(eval_overlap.summary(), "this run"))
    return PreparedData(
        train=train,
        eval=evaluation,
        tokenizer=tokenizer,
        train_pairs_sha256=sha256_json(freeze_probe(train, tokenizer, settings)),
        probe_sha256=probe_sha,
        rejected=rejected,
        prepared_manifest_sha256=manifest_sha256,
        train_content=train_content,
        eval_overlap=eval_overlap,
    )
