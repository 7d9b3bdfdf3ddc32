"""The DPO objective: settings, per-pair loss and TRL-style metrics, training and evaluation.

Training: `DPOPolicyObjective` is a *component* of the one training loop
(`rewardplane.train.loop`): the loop owns data order, accumulation, optimiser, checkpoints and
logging; the objective builds the policy and its frozen reference, turns a collated batch into
per-pair losses and per-pair metric values (`dpo_batch`), which the loop sums and divides by
the global number of pairs exactly as it does for reward models.

Evaluation: `load_scorer` scores a saved policy by its implicit reward
β·(log π(y|x) − log π_ref(y|x)) with the same `dpo_batch`, through the one pairs → scores path
(`rewardplane.objectives.base.score_in_batches`), so `rewardplane eval` and the training loop's
evaluation compute the same numbers.

Sequence log-probs are sums over completion tokens (`rewardplane.models.policy`), except for
`loss_type: ipo`, which is defined on length-averaged log-probs (as in TRL). The reference
(live, precomputed or absent) is `rewardplane.objectives.dpo_reference`'s.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewardplane.core.errors import ConfigError, UsageError
from rewardplane.core.progress import Progress
from rewardplane.data.collate import collate
from rewardplane.data.records import TokenizedPair
from rewardplane.data.tokenize import pad_token_id
from rewardplane.models.attention import packed_row_length
from rewardplane.models.loading import CheckpointError, load_model_weights
from rewardplane.models.lora import (
    adapters_disabled,
    apply_lora,
    load_adapter,
    merged_state_dict,
    write_adapter,
)
from rewardplane.models.policy import (
    POLICY_LOADER,
    batch_logps,
    build_policy,
    check_policy_semantics,
    write_causal_lm,
)
from rewardplane.models.reference import ReferenceSidecar, check_sidecar
from rewardplane.objectives.base import (
    BatchScore,
    MicroBatchOutput,
    PairScorer,
    PairScores,
    Sections,
    TrainPairs,
    check_objective,
    score_in_batches,
    tokenisation_record,
)
from rewardplane.objectives.dpo_reference import (
    FrozenReference,
    build_training_reference,
    load_eval_reference,
    load_frozen_causal_lm,
    precompute_reference,
    release,
)
from rewardplane.objectives.dpo_settings import DPOSettings, ReferenceSettings  # the `dpo:` section
from rewardplane.objectives.losses import dpo_loss, dpo_rewards

if TYPE_CHECKING:
    import torch
    from torch import nn

    from rewardplane.data.collate import Batch

log = logging.getLogger(__name__)

OBJECTIVE = "dpo"
ROLE = "policy"
HEAD_TYPE = "causal_lm"

TIE_TOLERANCE = 1e-6
"""|reward margin| at or below this counts as a tie (half credit in tie-aware accuracy)."""


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


def dpo_batch(
    settings: DPOSettings, reference: FrozenReference, policy, batch: Batch, pairs: Sequence[TokenizedPair]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(per-pair loss [n], {metric: per-pair values [n]}) of one collated batch; the loop reduces both."""
    ref_c, ref_r = reference.batch(batch, pairs)
    pol_c, pol_r = batch_logps(policy, batch, pairs, average=settings.average_logps)
    losses = dpo_loss(
        settings.loss_type,
        pol_c,
        pol_r,
        ref_c,
        ref_r,
        beta=settings.beta,
        label_smoothing=settings.label_smoothing,
    )
    return losses, dpo_metrics(pol_c, pol_r, ref_c, ref_r, beta=settings.beta)


def batch_score(settings: DPOSettings, reference: FrozenReference) -> BatchScore:
    """Evaluation's view of `dpo_batch`: implicit rewards (chosen, rejected) and per-pair losses."""

    def score(policy, batch: Batch, pairs: Sequence[TokenizedPair]):
        losses, metrics = dpo_batch(settings, reference, policy, batch, pairs)
        return metrics["rewards/chosen"], metrics["rewards/rejected"], losses

    return score


# ---- evaluation of a saved policy ---------------------------------------------------------------
def settings_from_metadata(meta: dict[str, Any]) -> DPOSettings:
    """The `dpo:` settings a checkpoint was trained with (beta, loss type, reference source)."""
    raw = dict(meta.get("dpo") or {})
    if not raw:
        raise UsageError("DPO checkpoint records no dpo settings (beta, loss_type)", code="bad_checkpoint")
    return DPOSettings(**{**raw, "reference": ReferenceSettings(**(raw.get("reference") or {}))})


def load_scorer(
    path: str | Path,
    *,
    device: str,
    reference_path: str | Path | None = None,
    dtype: str = "fp32",
    max_batch_tokens: int | None = None,
) -> PairScorer:
    """A DPO checkpoint as a preference scorer: the implicit reward β·(log π(y|x) − log π_ref(y|x)).

    The reference comes from `reference_path` or, for `source: snapshot`, the pinned snapshot
    the checkpoint names, and must match the checkpoint's sidecar (`load_eval_reference`): a
    policy scored against another reference would report a different, meaningless reward.
    Log-probabilities are summed over every completion token in fp32, in right-padded batches of
    pairs (`batch_size`); `max_batch_tokens` is the reward models' knob and not read here.
    """
    if dtype != "fp32":
        raise UsageError(f"--dtype {dtype}: DPO policies are scored in fp32 (log-probability sums); {path}")
    from transformers import AutoTokenizer

    from rewardplane.models.loading import read_verified_metadata

    meta = read_verified_metadata(path)  # weight files checked against their recorded SHA-256
    settings = settings_from_metadata(meta)
    policy = load_frozen_causal_lm(path).to(device)
    reference = None
    if settings.needs_reference:
        reference = load_eval_reference(settings, meta.get("reference"), reference_path).to(device)
    score = batch_score(settings, FrozenReference(model=reference, average=settings.average_logps))
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    pad = pad_token_id(tokenizer)

    def score_pairs(
        pairs: list[TokenizedPair], batch_size: int, progress: Progress | None = None
    ) -> PairScores:
        return score_in_batches(policy, pairs, batch_size, score, pad_token_id=pad, progress=progress)

    identity = {**meta, "reference_path": str(reference_path) if reference_path is not None else None}
    scoring = {"path": "padded pairs (policy and reference log-probs)", "attention": "padded"}
    return PairScorer(OBJECTIVE, tokenizer, identity, score_pairs, None, scoring)


# ---- training -----------------------------------------------------------------------------------
class DPOPolicyObjective:
    """The loop's `Objective` for DPO: builds policy + frozen reference, reduces per-pair losses.

    Built from its typed sections (`model`, `data.max_length`, the run's shape and its own
    `dpo:` settings) and the pairs it trains on, whose digests key a precomputed reference.
    """

    name = OBJECTIVE
    role = ROLE

    def __init__(self, sections: Sections[DPOSettings], pairs: TrainPairs) -> None:
        self.model_cfg, self.data_cfg, self.run = sections.model, sections.data, sections.run
        self.settings: DPOSettings = sections.settings
        self.train_pairs = list(pairs.train)
        self.eval_pairs = list(pairs.eval)
        self.train_pairs_sha256 = pairs.train_sha256
        self.eval_sha256 = pairs.eval_sha256
        self.pad_token_id = 0
        self.policy: nn.Module | None = None
        self.reference: nn.Module | None = None
        self.sidecar: ReferenceSidecar | None = None
        self._train_reference: FrozenReference | None = None
        self._eval_reference: FrozenReference | None = None
        self._metadata: dict[str, Any] = {}
        self.lora = sections.model.lora

    # ---- model ------------------------------------------------------------------------
    @property
    def _lora_json(self) -> dict[str, Any] | None:
        """`model.lora` as checkpoints record it and resumes compare it."""
        return self.lora.model_dump() if self.lora else None

    @property
    def _reference_is_policy(self) -> bool:
        return self.reference is not None and self.reference is self.policy

    def _reference_context(self):
        if self._reference_is_policy:
            return adapters_disabled(self.policy)
        return contextlib.nullcontext()

    def build_model(self, tokenizer: Any) -> nn.Module:
        policy = build_policy(self.model_cfg, vocab_size=len(tokenizer))
        if len(tokenizer) > policy.config.vocab_size:
            raise ConfigError(
                f"tokenizer has {len(tokenizer)} tokens but the policy's vocabulary is {policy.config.vocab_size}"
            )
        check_policy_semantics(policy, allow_dropout=self.settings.allow_dropout)
        self.pad_token_id = pad_token_id(tokenizer)
        if self.lora is not None:
            if self.lora.dropout > 0 and not self.settings.allow_dropout:
                raise ConfigError(
                    f"model.lora.dropout={self.lora.dropout}: dropout makes the policy's log-probs"
                    " stochastic; set dpo.allow_dropout: true to train with it anyway"
                )
            # digest the base before adapters exist: it is what a LoRA run's reference is
            policy = self._with_reference_of_base(policy)
        else:
            self._build_reference(policy)
        self.policy = policy
        self._metadata = {
            "objective": self.name,
            "role": self.role,
            "head_type": HEAD_TYPE,
            "loader": POLICY_LOADER,
            "architecture": type(policy.get_base_model() if self.lora else policy).__name__,
            "dpo": self.settings.to_json(),
            "lora": self._lora_json,
            "reference": self.sidecar.to_json() if self.sidecar else None,
            **tokenisation_record(tokenizer, policy.config, self.data_cfg.max_length),
        }
        return policy

    def _build_reference(self, policy: nn.Module) -> None:
        if self.settings.needs_reference:
            self.reference, self.sidecar = build_training_reference(policy, self.settings, lora=self.lora)

    def _with_reference_of_base(self, base: nn.Module) -> nn.Module:
        """Build the reference against the plain base (a snapshot is checked against it, the
        initial policy is digested as it), then wrap the base with fresh adapters."""
        self._build_reference(base)
        policy = apply_lora(base, self.lora)
        if self.reference is base:
            self.reference = policy  # the same frozen weights, reached with adapters disabled
        return policy

    def prepare(self, device: torch.device) -> None:
        self._prepare(device)

    def _prepare(self, device: torch.device) -> FrozenReference:
        """Move the reference next to the policy, or score everything once and free it."""
        if self._train_reference is not None:
            return self._train_reference
        s = self.settings
        if self.reference is None or not s.precompute_reference:
            if self.reference is not None:
                self.reference.to(device)
            self._train_reference = FrozenReference(
                model=self.reference, average=s.average_logps, context=self._reference_context
            )
            return self._train_reference
        self.reference.to(device)
        cache_dir = Path(s.reference_cache_dir or Path(self.run.run_dir) / "reference_cache")
        common = {
            "cache_dir": cache_dir,
            "reference_digest": self.sidecar.param_sha256,
            "average": s.average_logps,
            "batch_size": s.reference_batch_size or self._micro_batch_pairs(),
            "layout": self.run.layout,
            "pad_token_id": self.pad_token_id,
            "context": self._reference_context,
        }
        train = precompute_reference(
            self.reference, self.train_pairs, data_digest=self.train_pairs_sha256, **common
        )
        if self.eval_pairs:
            eval_logps = precompute_reference(
                self.reference, self.eval_pairs, data_digest=self.eval_sha256 or "eval", **common
            )
            self._eval_reference = FrozenReference(logps=eval_logps)
        if not self._reference_is_policy:  # a LoRA policy's base is the policy: nothing to free
            release(self.reference)
        self.reference = None
        self._train_reference = FrozenReference(logps=train)
        return self._train_reference

    def _micro_batch_pairs(self) -> int:
        """Pairs per training micro-batch: a reference pass at this size needs no more
        activation memory than training does (and with LoRA on `initial_policy` the pass runs
        on the policy itself, so a larger batch would set the run's peak)."""
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_initialized() else 1
        return max(1, self.run.global_batch_pairs // (world * self.run.grad_accum))

    # ---- the loop's protocol ----------------------------------------------------------
    def micro_batch(
        self, model: nn.Module, pairs: Sequence[TokenizedPair], device: torch.device
    ) -> MicroBatchOutput:
        reference = self._prepare(device)
        batch = collate(
            pairs,
            layout=self.run.layout,
            pad_token_id=self.pad_token_id,
            max_length=self.data_cfg.max_length,
            row_length=packed_row_length(self.policy.config, self.data_cfg.max_length),
        ).to(device)
        losses, metrics = dpo_batch(self.settings, reference, model, batch, pairs)
        return MicroBatchOutput(
            loss_sum=losses.sum(),
            chosen=metrics["rewards/chosen"],
            rejected=metrics["rewards/rejected"],
            num_tokens=batch.num_tokens,
            num_slots=batch.num_slots,
            extra=metrics,
        )

    def score(self, model: nn.Module, pairs: Sequence[TokenizedPair], batch_size: int) -> PairScores:
        """Implicit rewards (chosen, rejected) and per-pair DPO losses, float64, input order."""
        reference = self._prepare(next(model.parameters()).device)
        score = batch_score(self.settings, self._eval_reference or reference)
        return score_in_batches(
            model, pairs, batch_size, score, layout=self.run.layout, pad_token_id=self.pad_token_id
        )

    def write_model(self, directory: Path, state_dict: dict[str, torch.Tensor], tokenizer: Any) -> str:
        """The plain causal LM; with LoRA, merged, plus peft's adapter files for resume."""
        if self.lora is None:
            return write_causal_lm(Path(directory), self.policy, state_dict, tokenizer)
        merged = merged_state_dict(state_dict, self.lora.scaling)
        sha = write_causal_lm(Path(directory), self.policy.get_base_model(), merged, tokenizer)
        write_adapter(Path(directory), self.policy, state_dict)
        return sha

    def load_model_state(self, model: nn.Module, directory: Path) -> None:
        """Full runs load the weights; LoRA runs load only the adapters onto the rebuilt base."""
        if self.lora is None:
            load_model_weights(model, directory)
        else:
            load_adapter(model, directory)

    def checkpoint_metadata(self) -> dict[str, Any]:
        return dict(self._metadata)

    def validate_resume(self, metadata: dict[str, Any]) -> None:
        """Same objective, same loss, and the very same reference (parameter digest recomputed)."""
        check_objective(metadata, self.name, self.role, "DPO")
        lora = self._lora_json
        if metadata.get("lora") != lora:
            raise CheckpointError(
                f"checkpoint was trained with model.lora={metadata.get('lora')!r}, this run has {lora!r}",
                code="lora_mismatch",
            )
        recorded = metadata.get("dpo") or {}
        for key in ("loss_type", "beta", "label_smoothing"):
            if recorded.get(key) != getattr(self.settings, key):
                raise CheckpointError(
                    f"checkpoint was trained with dpo.{key}={recorded.get(key)!r}, this run has"
                    f" {getattr(self.settings, key)!r}",
                    code="dpo_settings_mismatch",
                )
        if self.sidecar is not None:
            if not metadata.get("reference"):
                raise CheckpointError("checkpoint records no reference sidecar", code="reference_mismatch")
            check_sidecar(ReferenceSidecar.from_json(metadata["reference"]), self.sidecar)
