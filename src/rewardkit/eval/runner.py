"""`rewardkit eval`: score a frozen probe with a model and write the evaluation artifacts.

The steps are deliberately the training loop's: read and tokenise the evaluation data with
the data pipeline under the probe's recorded settings, refuse it unless it matches the probe
(ids, order, token hashes, tokenizer), score every pair, write pairs.jsonl + summary.json.
So a number from `rewardkit eval` and one from training's final evaluation of the same
checkpoint are the same measurement and can be passed to `rewardkit compare`.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from rewardkit.core.errors import RewardkitError, UsageError
from rewardkit.data.reader import iter_pairs
from rewardkit.data.reasons import Rejection
from rewardkit.data.records import TokenizedPair
from rewardkit.data.tokenize import TokenizeSettings, tokenize_pair
from rewardkit.eval.artifacts import write_eval_artifacts
from rewardkit.eval.bootstrap import DEFAULT_REPLICATES, DEFAULT_SEED
from rewardkit.objectives.base import PairScorer

log = logging.getLogger(__name__)


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
    data_path: str | Path, tokenizer: Any, settings: TokenizeSettings
) -> list[TokenizedPair]:
    """Accepted pairs in input order; rejected rows are counted by reason and logged, as in training."""
    pairs: list[TokenizedPair] = []
    rejected: Counter[str] = Counter()
    for item in iter_pairs(data_path):
        if isinstance(item, Rejection):
            rejected[item.reason] += 1
            continue
        try:
            pairs.append(tokenize_pair(item, tokenizer, settings))
        except Rejection as rejection:
            rejected[rejection.reason] += 1
    if rejected:
        log.warning("%s: rejected rows by reason: %s", data_path, dict(sorted(rejected.items())))
    if not pairs:
        raise UsageError(f"{data_path}: no evaluation pairs left after validation", code="empty_eval_data")
    return pairs


def _device(requested: str | None) -> str:
    import torch

    if requested is not None:
        if requested.startswith("cuda") and not torch.cuda.is_available():
            raise UsageError("--device cuda requested but CUDA is not available")
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"


def reward_model_scorer(model_path: str | Path, device: str) -> PairScorer:
    """A rewardkit reward-model checkpoint or an HF `*ForSequenceClassification` dir (num_labels 1)."""
    from rewardkit.models.loading import load_reward_model
    from rewardkit.models.reward_model import score_pairs

    model, tokenizer, metadata = load_reward_model(model_path, device=device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def score(pairs: list[TokenizedPair], batch_size: int):
        chosen, rejected = score_pairs(model, pairs, batch_size, pad_token_id=pad or 0)
        return chosen, rejected, None  # Bradley–Terry loss from the margin

    return PairScorer(metadata.get("objective", "reward_model"), tokenizer, metadata, score)


def evaluate(
    *,
    model_path: str | Path,
    probe_path: str | Path,
    data_path: str | Path,
    out_dir: str | Path,
    batch_size: int = 16,
    reference_path: str | Path | None = None,
    device: str | None = None,
    seed: int = DEFAULT_SEED,
    replicates: int = DEFAULT_REPLICATES,
) -> dict[str, Any]:
    """Check the data against the probe, score every pair, write the artifacts; return the summary.

    A DPO checkpoint (rewardkit.json with objective `dpo`) is scored by its implicit reward
    β·(log π − log π_ref); anything else must load as a reward model.
    """
    from rewardkit.data.probe import check_probe
    from rewardkit.objectives.dpo_scoring import dpo_scorer, is_dpo_checkpoint

    probe = load_probe(probe_path)
    settings = TokenizeSettings(**probe["settings"])
    device = _device(device)
    try:
        if is_dpo_checkpoint(model_path):
            scorer = dpo_scorer(model_path, reference_path, device)
        elif reference_path is not None:
            raise UsageError(
                f"--reference applies to DPO policies only; {model_path} is not a DPO checkpoint"
            )
        else:
            scorer = reward_model_scorer(model_path, device)
    except UsageError:
        raise
    except RewardkitError as exc:  # a directory that is not a loadable model: bad input, one line
        raise UsageError(exc.message, code=exc.code) from None
    pairs = tokenize_eval_data(data_path, scorer.tokenizer, settings)
    check_probe(probe, pairs, tokenizer=scorer.tokenizer, settings=settings)
    chosen, rejected, losses = scorer.score(pairs, batch_size)
    for name, values in (("chosen", chosen), ("rejected", rejected), ("loss", losses)):
        bad = [] if values is None else np.flatnonzero(~np.isfinite(values))
        if len(bad):
            # a failed forward pass must not become a measured preference
            raise UsageError(
                f"model gave {len(bad)} non-finite {name} value(s), first for pair {pairs[bad[0]].pair_id!r}; "
                "nothing written",
                code="non_finite_scores",
            )
    plan = {
        "batch_size": batch_size,
        "layout": "right",
        "precision": "fp32",
        "device_type": device.split(":")[0],
    }
    return write_eval_artifacts(
        out_dir,
        pair_ids=[p.pair_id for p in pairs],
        chosen_scores=chosen,
        rejected_scores=rejected,
        subsets=[p.subset for p in pairs],
        probe_sha256=probe["tokens_sha256"],
        objective=scorer.objective,
        model_identity={"path": str(model_path), **scorer.metadata},
        batch_plan=plan,
        seed=seed,
        replicates=replicates,
        pair_losses=losses,
    )
