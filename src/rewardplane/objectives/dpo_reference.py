"""DPO's frozen reference: building it for training, caching its log-probs, loading it for evaluation.

The reference is frozen. Either it runs live next to the policy (one extra no-grad forward
per batch), or `precompute_reference: true` scores every training pair once before step 0,
stores the log-probs on disk keyed by the data digest and the reference's parameter digest,
and frees the reference model, which leaves the policy alone on the accelerator.
`FrozenReference` hides which of the two (or neither, for `reference_free`) a batch sees.

A DPO checkpoint records *which* reference it was trained against (the sidecar: source, repo,
revision and a digest of the reference's parameters) but not its weights: `load_eval_reference`
finds it again and refuses one whose parameter digest differs.

Settings arguments are `rewardplane.objectives.dpo.DPOSettings` / `ReferenceSettings`, read by
attribute (this module sits below `dpo.py`, which imports it).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewardplane.core.errors import ConfigError, RewardplaneError, UsageError
from rewardplane.core.hashing import sha256_json
from rewardplane.models.policy import POLICY_LOADER, batch_logps

if TYPE_CHECKING:
    import torch
    from torch import nn

    from rewardplane.data.collate import Batch
    from rewardplane.data.records import TokenizedPair
    from rewardplane.models.reference import ReferenceSidecar

log = logging.getLogger(__name__)

CACHE_FORMAT = 1


def tokenized_digest(pairs: Sequence[TokenizedPair]) -> str:
    """SHA-256 over exactly what the reference scores: pair ids, token ids and loss masks."""
    return sha256_json(
        [
            [p.pair_id, p.chosen.input_ids, p.chosen.loss_mask, p.rejected.input_ids, p.rejected.loss_mask]
            for p in pairs
        ]
    )


class ReferenceCacheError(RewardplaneError):
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

    from rewardplane.core.atomic import write_bytes
    from rewardplane.data.collate import collate

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


class FrozenReference:
    """The reference's (chosen, rejected) log-probs for a batch: from a live frozen model (run
    under no_grad, inside `context`), from the precomputed cache, or none (`reference_free`)."""

    def __init__(
        self,
        *,
        model=None,
        logps: ReferenceLogps | None = None,
        average: bool = False,
        context: Callable[[], AbstractContextManager] = contextlib.nullcontext,
    ) -> None:
        if model is not None and logps is not None:
            raise ValueError("a reference is either a live model or precomputed log-probs, not both")
        self.model = model
        self.logps = logps
        self.average = average
        # entered around every reference forward: a LoRA policy's own base runs with adapters off
        self.context = context

    def batch(self, batch: Batch, pairs: Sequence[TokenizedPair]):
        """(chosen, rejected) reference log-probs [n], or (None, None) without a reference."""
        import torch

        if self.logps is not None:
            return self.logps.lookup(pairs, batch.input_ids.device)
        if self.model is None:
            return None, None
        with torch.no_grad(), self.context():
            return batch_logps(self.model, batch, pairs, average=self.average)


def build_training_reference(policy: nn.Module, settings: Any, *, lora: Any) -> tuple[Any, ReferenceSidecar]:
    """The frozen reference of a run and its sidecar: a copy of the step-0 policy, a pinned
    snapshot, or (LoRA with `initial_policy`) the policy's own base, run with its adapters
    disabled: no copy at all (the caller wraps the base and points the reference at it).

    `dpo.reference_dtype: bf16` stores the frozen reference at half its fp32 size. Under bf16
    autocast its matmuls see the same bf16 weights either way; norms and the vocabulary
    projection then run in bf16 too. The parameter digest is taken in this dtype, so the
    precompute cache and resume checks tell the two apart.
    """
    import torch

    from rewardplane.models.loading import cast_weights
    from rewardplane.models.lora import BASE_LOADER
    from rewardplane.models.reference import PinnedSnapshot, freeze, load_pinned_reference, sidecar_for

    ref = settings.reference
    dtype = torch.bfloat16 if settings.reference_dtype == "bf16" else torch.float32
    if ref.source == "initial_policy" and lora is not None:
        if settings.reference_dtype != "fp32":
            raise ConfigError(
                "dpo.reference_dtype: with model.lora and reference.source: initial_policy the"
                " reference is the policy's own frozen base, which has no dtype of its own"
            )
        return policy, sidecar_for(policy, source="initial_policy", loader=f"{POLICY_LOADER}+{BASE_LOADER}")
    if ref.source == "initial_policy":
        # cast_weights, not .to(dtype): RoPE's inverse frequencies stay fp32, as from_pretrained keeps them
        reference = cast_weights(freeze(copy.deepcopy(policy)), dtype)
        return reference, sidecar_for(reference, source="initial_policy")
    spec = PinnedSnapshot(
        ref.repo, ref.revision, Path(ref.path), Path(ref.cache_dir) if ref.cache_dir else None
    )
    # the policy's attention, so both read a packed batch the same way (rk_varlen: one row)
    reference = load_pinned_reference(
        spec, dtype=dtype, attn_implementation=policy.config._attn_implementation
    )
    if reference.config.vocab_size != policy.config.vocab_size:
        raise ConfigError(
            f"reference vocabulary {reference.config.vocab_size} != policy vocabulary"
            f" {policy.config.vocab_size}: log-probs would be over different tokens"
        )
    return reference, sidecar_for(reference, source="snapshot", repo=ref.repo, revision=ref.revision)


def load_frozen_causal_lm(path: str | Path):
    """A saved causal LM (a DPO checkpoint's policy, or a reference directory), fp32, frozen."""
    import torch
    from transformers import AutoModelForCausalLM

    from rewardplane.models.reference import freeze

    return freeze(AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32))


def load_eval_reference(settings: Any, sidecar: dict[str, Any] | None, reference_path: str | Path | None):
    """The reference a DPO checkpoint was trained against: `reference_path`, or the pinned
    snapshot its settings name; either way its parameter digest must equal the sidecar's."""
    import torch

    from rewardplane.models.reference import PinnedSnapshot, load_pinned_reference, parameter_digest

    if sidecar is None:
        raise UsageError("DPO checkpoint records no reference sidecar", code="reference_mismatch")
    if reference_path is not None:
        reference = load_frozen_causal_lm(reference_path)
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
