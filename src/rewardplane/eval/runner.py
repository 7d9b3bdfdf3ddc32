"""`rewardplane eval`: score a frozen probe with a model and write the evaluation artifacts.

The steps are deliberately the training loop's: read and tokenise the evaluation data with
the data pipeline under the probe's recorded settings, refuse it unless it matches the probe
(ids, order, token hashes, tokenizer), score every pair, write pairs.jsonl + summary.json.
So a number from `rewardplane eval` and one from training's final evaluation of the same
checkpoint are the same measurement and can be passed to `rewardplane compare`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from rewardplane.core import atomic
from rewardplane.core.errors import RewardplaneError, UsageError
from rewardplane.core.progress import Progress
from rewardplane.data.overlap import ContentHashes, Overlap, is_clean, overlap_line, read_training_content
from rewardplane.data.pipeline import Summary, tokenize_source
from rewardplane.data.records import TokenizedPair
from rewardplane.data.tokenize import LEGACY_SETTINGS, TokenizeSettings
from rewardplane.eval.artifacts import write_eval_artifacts
from rewardplane.eval.settings import EvalSettings
from rewardplane.objectives.base import PairScorer
from rewardplane.objectives.registry import load_pair_scorer
from rewardplane.objectives.reward_model import DEFAULT_MAX_BATCH_TOKENS

log = logging.getLogger(__name__)
THROUGHPUT_FILE = "throughput.json"


def load_probe(path: str | Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            probe = json.load(handle)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not JSON ({exc.msg})", code="bad_probe") from None
    if not isinstance(probe, dict) or "tokens_sha256" not in probe or "settings" not in probe:
        raise UsageError(f"{path}: not a probe document (no tokens_sha256/settings)", code="bad_probe")
    return probe


def tokenize_eval_data(
    data_path: str | Path,
    tokenizer: Any,
    settings: TokenizeSettings,
    summary: Summary | None = None,
    content: ContentHashes | None = None,
) -> list[TokenizedPair]:
    """Accepted pairs in input order; rejected rows are counted by reason and logged, as in training.
    `content` collects their content keys (`rewardplane.data.overlap`)."""
    summary = summary if summary is not None else Summary()
    pairs = tokenize_source(data_path, tokenizer, settings, summary, content=content)
    if summary.rejected:
        log.warning("%s: rejected rows by reason: %s", data_path, summary.nonzero())
    if not pairs:
        raise UsageError(f"{data_path}: no evaluation pairs left after validation", code="empty_eval_data")
    return pairs


def check_plain_text(
    meta: dict[str, Any],
    settings: TokenizeSettings,
    data_path: str | Path,
    tokenizer: Any,
    pairs: list[TokenizedPair],
    model_path: str | Path,
) -> None:
    """Refuse a probe whose plain-text pairs are tokenised otherwise than the checkpoint was trained.

    The probe's settings decide the tokens; a checkpoint records how its plain-text rows were
    tokenised (`plain_text`; none recorded: `chat_template`, rewardplane before issue 24). Where the
    two differ the data is tokenised the checkpoint's way too: if no pair changes (no plain-text
    rows) the score is the same measurement, otherwise the model would be scored on inputs it
    was not trained on, and that is a usage error naming the fix.
    """
    import dataclasses

    trained = meta.get("plain_text", LEGACY_SETTINGS["plain_text"])
    if trained == settings.plain_text:
        return
    own = tokenize_source(data_path, tokenizer, dataclasses.replace(settings, plain_text=trained))
    if own != pairs:
        raise UsageError(
            f"{model_path} was trained with plain-text rows tokenised as {trained!r} but the probe "
            f"tokenises them as {settings.plain_text!r}: freeze the probe with "
            f"`rewardplane data freeze-probe --plain-text {trained}`",
            code="plain_text_mismatch",
        )


def scoring_progress(total: int, enabled: bool, every_s: float) -> Progress:
    """Scoring's progress on stderr, as training's: a live bar on a terminal, otherwise one line
    every `every_s` seconds and one at the end (a log file gets a bounded number of lines)."""
    return Progress(total, "eval", unit="pair", every_s=every_s, enabled=enabled)


def load_model(
    model_path: str | Path,
    *,
    device: str,
    reference_path: str | Path | None = None,
    dtype: str = "fp32",
    max_batch_tokens: int | None = None,
) -> PairScorer:
    """The checkpoint's scorer (`max_batch_tokens` None: the reward models' default), or a
    one-line `UsageError`: a `--model` that does not exist, is corrupt or is not a model is bad
    input (exit 2), never a traceback (REWARDPLANE_DEBUG=1 re-raises what transformers /
    safetensors failed on)."""
    try:
        return load_pair_scorer(
            model_path, device=device, reference_path=reference_path, dtype=dtype,
            max_batch_tokens=max_batch_tokens or DEFAULT_MAX_BATCH_TOKENS,
        )  # fmt: skip
    except UsageError:
        raise
    except RewardplaneError as exc:  # a directory that is not a loadable model: bad input, one line
        raise UsageError(exc.message, code=exc.code) from None
    except Exception as exc:  # a file transformers / safetensors cannot read (corrupt, truncated)
        if os.environ.get("REWARDPLANE_DEBUG"):
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        raise UsageError(
            f"{model_path}: cannot load the model ({type(exc).__name__}: {first}); "
            "REWARDPLANE_DEBUG=1 shows the traceback",
            code="bad_checkpoint",
        ) from None


def training_overlap(
    model_path: str | Path, meta: dict[str, Any], content: ContentHashes, *, strict: bool
) -> Overlap:
    """Which evaluated pairs the model was trained on (its checkpoint's record), or why that cannot
    be checked; with `strict`, anything but a checked zero is a usage error, before any scoring."""
    record = read_training_content(model_path, meta)
    overlap = Overlap.unchecked(record) if isinstance(record, str) else record.find(content)
    if strict and not is_clean(overlap.summary()):
        raise UsageError(f"--strict-overlap: {overlap_line(overlap.summary())}", code="train_overlap")
    return overlap


def _device(requested: str | None) -> str:
    import torch

    if requested is not None:
        if requested.startswith("cuda") and not torch.cuda.is_available():
            raise UsageError("--device cuda requested but CUDA is not available")
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"


def evaluate(
    *,
    model_path: str | Path,
    probe_path: str | Path,
    data_path: str | Path,
    out_dir: str | Path,
    options: EvalSettings = EvalSettings(),
    strict_overlap: bool = False,
) -> dict[str, Any]:
    """Check the data against the probe, score every pair, write the artifacts; return the summary.

    The summary's `train_overlap` counts the evaluated pairs that are in the model's training data
    (`rewardplane.data.overlap`); `strict_overlap` refuses, before scoring, unless that count was
    checked and is 0.

    The checkpoint's recorded `objective` picks its scorer (`rewardplane.objectives.registry`): a
    DPO policy is scored by its implicit reward β·(log π − log π_ref), a reward model (or an HF
    `*ForSequenceClassification` directory) by its scalar head.
    """
    from rewardplane.data.probe import check_probe

    probe = load_probe(probe_path)
    settings = TokenizeSettings.from_json(probe["settings"])
    device = _device(options.device)
    scorer = load_model(model_path, device=device, **options.model_kwargs())
    data, content = Summary(), ContentHashes()
    pairs = tokenize_eval_data(data_path, scorer.tokenizer, settings, data, content)
    check_probe(probe, pairs, tokenizer=scorer.tokenizer, settings=settings)
    check_plain_text(scorer.metadata, settings, data_path, scorer.tokenizer, pairs, model_path)
    overlap = training_overlap(model_path, scorer.metadata, content, strict=strict_overlap)
    started = time.perf_counter()
    with scoring_progress(len(pairs), options.progress, options.progress_every_s) as bar:
        chosen, rejected, losses = scorer.score(pairs, options.batch_size, bar)
    seconds = time.perf_counter() - started
    _refuse_non_finite(pairs, chosen=chosen, rejected=rejected, loss=losses)
    plan = {
        "batch_size": options.batch_size,
        "layout": "packed" if scorer.scoring.get("attention") == "varlen" else "right",
        "precision": options.dtype,
        "device_type": device.split(":")[0],
    }
    summary = write_eval_artifacts(
        out_dir,
        pair_ids=[p.pair_id for p in pairs],
        chosen_scores=chosen,
        rejected_scores=rejected,
        subsets=[p.subset for p in pairs],
        probe_sha256=probe["tokens_sha256"],
        objective=scorer.objective,
        model_identity={"path": str(model_path), **scorer.metadata},
        batch_plan=plan,
        seed=options.seed,
        replicates=options.replicates,
        pair_losses=losses,
        overlap=overlap,
        completion_tokens=(
            [sum(p.chosen.loss_mask) for p in pairs],
            [sum(p.rejected.loss_mask) for p in pairs],
        ),
        extra={"data": _data_record(data, settings)},
    )
    # timing varies run to run: kept out of summary.json, whose bytes depend only on the scores
    tokens = sum(p.num_tokens for p in pairs)
    atomic.write_json(
        Path(out_dir) / THROUGHPUT_FILE,
        {
            "pairs": len(pairs),
            "tokens": tokens,
            "seconds": seconds,
            "pairs_per_s": len(pairs) / seconds if seconds > 0 else None,
            "tokens_per_s": tokens / seconds if seconds > 0 else None,
            **options.record(device),
            **scorer.scoring,
        },
    )
    return summary


def _refuse_non_finite(pairs: list[TokenizedPair], **values: np.ndarray | None) -> None:
    """A failed forward pass must not become a measured preference: NaN or inf refuses the run."""
    for name, array in values.items():
        bad = [] if array is None else np.flatnonzero(~np.isfinite(array))
        if len(bad):
            raise UsageError(
                f"model gave {len(bad)} non-finite {name} value(s), first for pair {pairs[bad[0]].pair_id!r}; "
                "nothing written",
                code="non_finite_scores",
            )


def _data_record(data: Summary, settings: TokenizeSettings) -> dict[str, Any]:
    """summary.json's `data`: the rows read, rejections by reason, and whether any pair was cut."""
    return {
        **{k: v for k, v in data.to_json().items() if k != "rejections"},
        "rejections": data.nonzero(),
        "truncation": settings.truncation,
        # drop rejects over-length pairs (counted as oversize), so none is cut
        "truncated": 0 if settings.truncation == "drop" else None,
    }
