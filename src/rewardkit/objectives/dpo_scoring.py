"""DPO policies as preference scorers: the implicit reward β·(log π(y|x) − log π_ref(y|x)).

A DPO checkpoint records *which* reference it was trained against (the sidecar: source,
repo, revision and a digest of the reference's parameters) but not the reference weights.
The reference is loaded from `--reference DIR`, or, for `source: snapshot`, from the pinned
snapshot named in the checkpoint's DPO settings (provenance-verified by
`rewardkit.models.reference`). Either way its parameter digest must equal the sidecar's: a
policy scored against a different reference would report a different, meaningless reward.
Scores, losses and metrics come from the DPO objective itself, so `rewardkit eval` and the
training loop's evaluation compute the same numbers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from rewardkit.core.errors import UsageError
from rewardkit.data.records import TokenizedPair
from rewardkit.objectives.base import PairScorer

DPO_OBJECTIVE = "dpo"


def is_dpo_checkpoint(path: str | Path) -> bool:
    from rewardkit.models.loading import METADATA_FILE

    meta_path = Path(path) / METADATA_FILE
    return meta_path.is_file() and json.loads(meta_path.read_text()).get("objective") == DPO_OBJECTIVE


def _settings(meta: dict[str, Any]):
    from rewardkit.objectives.dpo import DPOSettings, ReferenceSettings

    raw = dict(meta.get("dpo") or {})
    if not raw:
        raise UsageError("DPO checkpoint records no dpo settings (beta, loss_type)", code="bad_checkpoint")
    return DPOSettings(**{**raw, "reference": ReferenceSettings(**(raw.get("reference") or {}))})


def _causal_lm(path: str | Path):
    import torch
    from transformers import AutoModelForCausalLM

    from rewardkit.models.reference import freeze

    return freeze(AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32))


def _reference(settings, sidecar: dict[str, Any] | None, reference_path: str | Path | None):
    import torch

    from rewardkit.models.reference import PinnedSnapshot, load_pinned_reference, parameter_digest

    if sidecar is None:
        raise UsageError("DPO checkpoint records no reference sidecar", code="reference_mismatch")
    if reference_path is not None:
        reference = _causal_lm(reference_path)
    elif settings.reference.source == "snapshot":
        ref = settings.reference
        cache = Path(ref.cache_dir) if ref.cache_dir else None
        reference = load_pinned_reference(
            PinnedSnapshot(ref.repo, ref.revision, Path(ref.path), cache), dtype=torch.float32
        )
    else:
        raise UsageError(
            "this policy's reference is its initial policy, which the checkpoint does not contain: "
            "pass --reference DIR with the model the run started from",
            code="reference_required",
        )
    digest = parameter_digest(reference)
    if digest != sidecar.get("param_sha256"):
        raise UsageError(
            f"reference parameters differ from the checkpoint's sidecar: digest {digest[:12]}, "
            f"recorded {str(sidecar.get('param_sha256'))[:12]}",
            code="reference_mismatch",
        )
    return reference


def dpo_scorer(path: str | Path, reference_path: str | Path | None, device: str) -> PairScorer:
    import torch
    from transformers import AutoTokenizer

    from rewardkit.data.collate import collate
    from rewardkit.models.loading import read_metadata
    from rewardkit.objectives.dpo import DPOObjective

    meta = read_metadata(path)
    settings = _settings(meta)
    policy = _causal_lm(path).to(device)
    reference = (
        _reference(settings, meta.get("reference"), reference_path) if settings.needs_reference else None
    )
    if reference is not None:
        reference.to(device)
    objective = DPOObjective(settings, reference=reference)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    @torch.no_grad()
    def score(pairs: list[TokenizedPair], batch_size: int):
        chosen, rejected, losses = [], [], []
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start : start + batch_size]
            batch = collate(chunk, layout="right", pad_token_id=pad or 0).to(device)
            loss, metrics = objective.loss(policy, batch, chunk)
            chosen.append(metrics["rewards/chosen"].double().cpu().numpy())
            rejected.append(metrics["rewards/rejected"].double().cpu().numpy())
            losses.append(loss.double().cpu().numpy())
        return np.concatenate(chosen), np.concatenate(rejected), np.concatenate(losses)

    identity = {**meta, "reference_path": str(reference_path) if reference_path is not None else None}
    return PairScorer(DPO_OBJECTIVE, tokenizer, identity, score)
