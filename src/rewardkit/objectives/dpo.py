"""The DPO objective: settings, per-pair loss and TRL-style metrics, and the reference log-prob cache.

This module is a *component* of the one training loop (`rewardkit.train.loop`): the loop owns
data order, accumulation, optimiser, checkpoints and logging; the objective turns a collated
batch into per-pair losses and per-pair metric values, which the loop sums and divides by the
global number of pairs exactly as it does for reward models.

Sequence log-probs are sums over completion tokens (`rewardkit.models.policy`), except for
`loss_type: ipo`, which is defined on length-averaged log-probs (as in TRL).

The reference is frozen. Either it runs live next to the policy (one extra no-grad forward
per batch), or `precompute_reference: true` scores every training pair once before step 0,
stores the log-probs on disk keyed by the data digest and the reference's parameter digest,
and frees the reference model, which leaves the policy alone on the accelerator.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict, Field, model_validator

from rewardkit.core.config import ConfigModel, Dtype
from rewardkit.core.errors import ConfigError, RewardkitError
from rewardkit.core.hashing import sha256_json
from rewardkit.objectives.losses import DPO_LOSS_TYPES, dpo_loss, dpo_rewards

if TYPE_CHECKING:
    import torch

    from rewardkit.data.collate import Batch
    from rewardkit.data.records import TokenizedPair

log = logging.getLogger(__name__)

TIE_TOLERANCE = 1e-6
"""|reward margin| at or below this counts as a tie (half credit in tie-aware accuracy)."""

REFERENCE_SOURCES = ("initial_policy", "snapshot")
CACHE_FORMAT = 1


class ReferenceSettings(ConfigModel):
    """`dpo.reference`: where the frozen reference comes from.

    `initial_policy` (default) snapshots the policy at step 0; `snapshot` loads a pinned local
    Hugging Face snapshot (`repo`, full 40-hex `revision`, `path`, optional `cache_dir`) after
    verifying its provenance (`rewardkit.models.reference`).
    """

    model_config = ConfigDict(frozen=True)

    source: str = "initial_policy"
    repo: str | None = None
    revision: str | None = None
    path: str | None = None
    cache_dir: str | None = None

    @model_validator(mode="after")
    def _check(self) -> ReferenceSettings:
        if self.source not in REFERENCE_SOURCES:
            raise ConfigError(f"dpo.reference.source must be one of {', '.join(REFERENCE_SOURCES)}")
        if self.source == "snapshot":
            missing = [k for k in ("repo", "revision", "path") if not getattr(self, k)]
            if missing:
                raise ConfigError(f"dpo.reference.source: snapshot needs {', '.join(missing)}")
        elif any((self.repo, self.revision, self.path, self.cache_dir)):
            raise ConfigError("dpo.reference.repo/revision/path/cache_dir only apply to source: snapshot")
        return self


REFERENCE_DTYPES = ("fp32", "bf16")


class DPOSettings(ConfigModel):
    """The `dpo:` config section (see docs/dpo.md for every key and why it defaults as it does).

    The checks raise `ConfigError` themselves (not `ValueError`): their messages name the
    `dpo.` keys they relate, which the loader passes through unchanged.
    """

    model_config = ConfigDict(frozen=True)

    loss_type: str = "sigmoid"
    beta: float = 0.1
    label_smoothing: float = 0.0
    temperature: float = 1.0
    allow_dropout: bool = False
    precompute_reference: bool = False
    reference_batch_size: int | None = Field(None, ge=1)  # None: the training micro-batch (docs/dpo.md)
    reference_dtype: Dtype = "fp32"  # bf16 halves the frozen reference's weights
    reference_cache_dir: str | None = None
    reference: ReferenceSettings = Field(default_factory=ReferenceSettings)

    @model_validator(mode="after")
    def _check(self) -> DPOSettings:
        if self.loss_type not in DPO_LOSS_TYPES:
            raise ConfigError(
                f"dpo.loss_type must be one of {', '.join(DPO_LOSS_TYPES)}, got {self.loss_type!r}"
            )
        if not (math.isfinite(self.beta) and self.beta > 0):
            raise ConfigError(f"dpo.beta must be a finite number > 0, got {self.beta!r}")
        if not 0 <= self.label_smoothing < 0.5:
            raise ConfigError(f"dpo.label_smoothing must be in [0, 0.5), got {self.label_smoothing!r}")
        if self.label_smoothing and self.loss_type not in ("sigmoid", "robust", "reference_free"):
            raise ConfigError(f"dpo.label_smoothing has no meaning for loss_type {self.loss_type!r}")
        # DPO's likelihood is the policy's own distribution: dividing logits by a temperature
        # changes π and π_ref differently once π moves, and the implicit reward loses its meaning.
        if not math.isfinite(self.temperature):
            raise ConfigError(f"dpo.temperature must be finite, got {self.temperature!r}")
        if self.temperature != 1.0:
            raise ConfigError(
                f"dpo.temperature={self.temperature}: DPO log-probs are taken at temperature 1; "
                "a sampling temperature does not apply to preference training"
            )
        if self.reference_dtype not in REFERENCE_DTYPES:
            raise ConfigError(
                f"dpo.reference_dtype must be one of {', '.join(REFERENCE_DTYPES)}, got {self.reference_dtype!r}"
            )
        if self.loss_type == "reference_free" and self.precompute_reference:
            raise ConfigError("dpo.precompute_reference has no reference to precompute with reference_free")
        return self

    @property
    def average_logps(self) -> bool:
        return self.loss_type == "ipo"

    @property
    def needs_reference(self) -> bool:
        return self.loss_type != "reference_free"

    def to_json(self) -> dict[str, Any]:
        return self.model_dump()


def check_lora(model_section: Any, dpo_section: Any) -> None:
    """Refuse LoRA without an explicit reference strategy.

    With adapters the natural reference is the base model with adapters disabled
    (`source: initial_policy`), but a pinned SFT snapshot is just as common; a default would
    silently pick one, so the strategy must be stated.
    """
    if not isinstance(model_section, dict) or model_section.get("lora") is None:
        return
    reference = (dpo_section or {}).get("reference") if isinstance(dpo_section, dict) else None
    if not isinstance(reference, dict) or "source" not in reference:
        raise ConfigError(
            "model.lora is set but dpo.reference.source is not: LoRA needs an explicit reference strategy"
            " (initial_policy: the frozen base with adapters disabled; snapshot: a pinned model)"
        )


def branch_targets(batch: Batch, pairs: Sequence[TokenizedPair]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-slot completion mask and sequence number (chosen_i = i, rejected_i = n + i, pad = −1).

    A branch occupies `len(branch)` slots of row `score_rows[k]` ending after its score token,
    so its first slot is `score_cols[k] − score_index`; this holds for every layout.
    """
    import torch

    branches = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    rows = batch.score_rows.tolist()
    cols = batch.score_cols.tolist()
    loss_mask = torch.zeros(batch.input_ids.shape, dtype=torch.long)
    sequence = torch.full(batch.input_ids.shape, -1, dtype=torch.long)
    for k, branch in enumerate(branches):
        start = cols[k] - branch.score_index
        stop = start + len(branch)
        loss_mask[rows[k], start:stop] = torch.tensor(branch.loss_mask, dtype=torch.long)
        sequence[rows[k], start:stop] = k
    device = batch.input_ids.device
    return loss_mask.to(device), sequence.to(device)


def batch_logps(
    model, batch: Batch, pairs: Sequence[TokenizedPair], *, average: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) completion log-probs [n] of one collated batch, one forward pass."""
    from rewardkit.models.policy import sequence_logps

    loss_mask, sequence = branch_targets(batch, pairs)
    logps, _ = sequence_logps(
        model,
        batch.input_ids,
        loss_mask,
        sequence,
        2 * len(pairs),
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        average=average,
    )
    return logps[: len(pairs)], logps[len(pairs) :]


def dpo_metrics(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor | None,
    reference_rejected: torch.Tensor | None,
    *,
    beta: float,
) -> dict[str, torch.Tensor]:
    """Per-pair values of TRL's DPO metrics (the loop averages them over the pairs of a step).

    `rewards/accuracies` is TRL's strict `chosen > rejected`; `rewards/tie_rate` and
    `rewards/accuracies_tie_aware` (a tie, |margin| ≤ 1e-6, counts 0.5) show how much of the
    strict accuracy is decided by rounding, which matters at step 0 where every margin is 0.
    """
    import torch

    chosen = dpo_rewards(policy_chosen, reference_chosen, beta=beta)
    rejected = dpo_rewards(policy_rejected, reference_rejected, beta=beta)
    margin = chosen - rejected
    tie = margin.abs() <= TIE_TOLERANCE
    return {
        "rewards/chosen": chosen,
        "rewards/rejected": rejected,
        "rewards/margins": margin,
        "rewards/accuracies": (chosen > rejected).float(),
        "rewards/tie_rate": tie.float(),
        "rewards/accuracies_tie_aware": torch.where(tie, 0.5, (margin > 0).float()),
        "logps/chosen": policy_chosen.detach(),
        "logps/rejected": policy_rejected.detach(),
    }


def tokenized_digest(pairs: Sequence[TokenizedPair]) -> str:
    """SHA-256 over exactly what the reference scores: pair ids, token ids and loss masks."""
    return sha256_json(
        [
            [p.pair_id, p.chosen.input_ids, p.chosen.loss_mask, p.rejected.input_ids, p.rejected.loss_mask]
            for p in pairs
        ]
    )


class ReferenceCacheError(RewardkitError):
    code = "reference_cache"


@dataclass
class ReferenceLogps:
    """Precomputed reference log-probs by pair id (fp32, CPU)."""

    key: str
    index: dict[str, int]
    chosen: torch.Tensor
    rejected: torch.Tensor

    def lookup(self, pairs: Sequence[TokenizedPair], device) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        try:
            rows = torch.tensor([self.index[p.pair_id] for p in pairs], dtype=torch.long)
        except KeyError as exc:
            raise ReferenceCacheError(
                f"pair {exc.args[0]!r} is not in the reference cache {self.key}"
            ) from exc
        return self.chosen[rows].to(device), self.rejected[rows].to(device)


def reference_cache_key(*, data_digest: str, reference_digest: str, average: bool) -> str:
    return sha256_json(
        {"format": CACHE_FORMAT, "data": data_digest, "reference": reference_digest, "average_logps": average}
    )


def precompute_reference(
    reference,
    pairs: Sequence[TokenizedPair],
    *,
    cache_dir: str | Path,
    data_digest: str,
    reference_digest: str,
    average: bool,
    batch_size: int,
    layout: str = "right",
    pad_token_id: int = 0,
    context: Callable[[], AbstractContextManager] = contextlib.nullcontext,
) -> ReferenceLogps:
    """Score every pair with the frozen reference once, or reuse the cache for the same key.

    The cache file is `<cache_dir>/<key>.safetensors`; the key covers the data digest, the
    reference's parameter digest and whether log-probs are averaged, so a changed dataset,
    reference or loss type can never reuse stale values. `context` is entered around the
    scoring (a LoRA policy's base runs with its adapters disabled).
    """
    import torch
    from safetensors import safe_open
    from safetensors.torch import save
    from tqdm.auto import tqdm

    from rewardkit.core.atomic import write_bytes
    from rewardkit.data.collate import collate

    key = reference_cache_key(data_digest=data_digest, reference_digest=reference_digest, average=average)
    path = Path(cache_dir) / f"{key}.safetensors"
    ids = [p.pair_id for p in pairs]
    if len(set(ids)) != len(ids):
        raise ReferenceCacheError("pair ids must be unique to cache reference log-probs")
    if path.is_file():
        with safe_open(str(path), framework="pt") as handle:
            meta = handle.metadata() or {}
            chosen, rejected = handle.get_tensor("chosen"), handle.get_tensor("rejected")
        cached_ids = meta.get("pair_ids", "").split("\n") if meta.get("pair_ids") else []
        if meta.get("key") == key and cached_ids == ids:
            log.info("reference log-probs: reusing cache %s", path)
            return ReferenceLogps(key, {pid: i for i, pid in enumerate(ids)}, chosen, rejected)
        log.warning("reference cache %s does not match this run; recomputing", path)
    device = next(reference.parameters()).device
    chosen_parts, rejected_parts = [], []
    with torch.no_grad(), context():
        for start in tqdm(range(0, len(pairs), batch_size), desc="reference log-probs", unit="batch"):
            chunk = pairs[start : start + batch_size]
            batch = collate(chunk, layout=layout, pad_token_id=pad_token_id).to(device)
            c, r = batch_logps(reference, batch, chunk, average=average)
            chosen_parts.append(c.float().cpu())
            rejected_parts.append(r.float().cpu())
    chosen = torch.cat(chosen_parts) if chosen_parts else torch.zeros(0)
    rejected = torch.cat(rejected_parts) if rejected_parts else torch.zeros(0)
    if "\n" in "".join(ids):
        raise ReferenceCacheError("pair ids with newlines cannot be cached")
    blob = save({"chosen": chosen, "rejected": rejected}, metadata={"key": key, "pair_ids": "\n".join(ids)})
    write_bytes(path, blob)
    log.info("reference log-probs: cached %d pairs at %s", len(ids), path)
    return ReferenceLogps(key, {pid: i for i, pid in enumerate(ids)}, chosen, rejected)


def release(model) -> None:
    """Drop a model's storage now (the caller must drop its references too)."""
    import torch

    for param in model.parameters():
        param.data = torch.empty(0, dtype=param.dtype, device=param.device)
    for buffer_owner in model.modules():
        for name, buf in list(buffer_owner.named_buffers(recurse=False)):
            setattr(buffer_owner, name, torch.empty(0, dtype=buf.dtype, device=buf.device))
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class DPOObjective:
    """Batch → per-pair DPO loss and metrics, against a live or precomputed frozen reference.

    Exactly one of `reference` (a frozen model, run under no_grad on the same batch) and
    `reference_logps` (the precomputed cache) is set, unless the loss is `reference_free`.
    """

    name = "dpo"

    def __init__(
        self,
        settings: DPOSettings,
        *,
        reference=None,
        reference_logps: ReferenceLogps | None = None,
        reference_context: Callable[[], AbstractContextManager] = contextlib.nullcontext,
    ):
        if settings.needs_reference and (reference is None) == (reference_logps is None):
            raise ValueError(
                "DPO needs exactly one of a live reference model or precomputed reference log-probs"
            )
        self.settings = settings
        self.reference = reference if settings.needs_reference else None
        self.reference_logps = reference_logps
        # entered around every reference forward: a LoRA policy's own base runs with adapters off
        self.reference_context = reference_context

    def reference_batch(self, batch: Batch, pairs: Sequence[TokenizedPair]):
        import torch

        if not self.settings.needs_reference:
            return None, None
        if self.reference_logps is not None:
            return self.reference_logps.lookup(pairs, batch.input_ids.device)
        with torch.no_grad(), self.reference_context():
            return batch_logps(self.reference, batch, pairs, average=self.settings.average_logps)

    def loss(self, policy, batch: Batch, pairs: Sequence[TokenizedPair]):
        """(per-pair loss [n], {metric: per-pair values [n]}); the loop reduces both."""
        s = self.settings
        ref_c, ref_r = self.reference_batch(batch, pairs)
        pol_c, pol_r = batch_logps(policy, batch, pairs, average=s.average_logps)
        losses = dpo_loss(
            s.loss_type, pol_c, pol_r, ref_c, ref_r, beta=s.beta, label_smoothing=s.label_smoothing
        )
        return losses, dpo_metrics(pol_c, pol_r, ref_c, ref_r, beta=s.beta)
