"""DPO recipe: the policy objective for the shared loop, config loading and `run(config)`.

`rewardkit train dpo --config cfg.yaml [key=value ...]` ends up in `run`. Everything that is
not DPO-specific (data preparation, sampling, accumulation, optimiser, checkpoints, resume,
evaluation artifacts) is the reward-model loop's, unchanged.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rewardkit.core.errors import ConfigError
from rewardkit.data.collate import collate
from rewardkit.data.records import TokenizedPair
from rewardkit.models.attention import packed_row_length
from rewardkit.models.loading import CheckpointError
from rewardkit.models.lora import (
    BASE_LOADER,
    adapters_disabled,
    apply_lora,
    load_adapter,
    merged_state_dict,
    write_adapter,
)
from rewardkit.models.policy import POLICY_LOADER, build_policy, check_policy_semantics, write_causal_lm
from rewardkit.models.reference import (
    PinnedSnapshot,
    ReferenceSidecar,
    check_sidecar,
    freeze,
    load_pinned_reference,
    sidecar_for,
)
from rewardkit.objectives.base import MicroBatchOutput, check_objective
from rewardkit.objectives.dpo import (
    DPOObjective,
    ReferenceLogps,
    batch_logps,
    dpo_metrics,
    precompute_reference,
    release,
)
from rewardkit.objectives.losses import dpo_loss
from rewardkit.train.checkpoint import load_model_weights
from rewardkit.train.config import DPOTrainConfig
from rewardkit.train.loop import EvalSet, RunResult, Trainer

log = logging.getLogger("rewardkit.train")

OBJECTIVE = "dpo"
ROLE = "policy"
HEAD_TYPE = "causal_lm"


class DPOPolicyObjective:
    """The loop's `Objective` for DPO: builds policy + frozen reference, reduces per-pair losses."""

    name = OBJECTIVE
    role = ROLE

    def __init__(
        self,
        cfg: DPOTrainConfig,
        *,
        train_pairs: Sequence[TokenizedPair],
        data_sha256: str,
        eval_pairs: Sequence[TokenizedPair] = (),
        eval_sha256: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.settings = cfg.dpo
        self.train_pairs = list(train_pairs)
        self.eval_pairs = list(eval_pairs)
        self.data_sha256 = data_sha256
        self.eval_sha256 = eval_sha256
        self.pad_token_id = 0
        self.policy: nn.Module | None = None
        self.reference: nn.Module | None = None
        self.sidecar: ReferenceSidecar | None = None
        self.component: DPOObjective | None = None
        self._eval_logps: ReferenceLogps | None = None
        self._metadata: dict[str, Any] = {}
        self.lora = cfg.model.lora

    # ---- model ------------------------------------------------------------------------
    @property
    def _reference_dtype(self) -> torch.dtype:
        """`dpo.reference_dtype`: bf16 stores the frozen reference at half its fp32 size. Under
        bf16 autocast its matmuls see the same bf16 weights either way; norms and the vocabulary
        projection then run in bf16 too. The parameter digest is taken in this dtype, so the
        precompute cache and resume checks tell the two apart."""
        return torch.bfloat16 if self.settings.reference_dtype == "bf16" else torch.float32

    def _build_reference(self, policy: nn.Module) -> None:
        """The frozen reference: a copy of the step-0 policy, a pinned snapshot, or (LoRA with
        `initial_policy`) the policy's own base, run with its adapters disabled: no copy at all."""
        ref = self.settings.reference
        if not self.settings.needs_reference:
            return
        if ref.source == "initial_policy" and self.lora is not None:
            if self.settings.reference_dtype != "fp32":
                raise ConfigError(
                    "dpo.reference_dtype: with model.lora and reference.source: initial_policy the"
                    " reference is the policy's own frozen base, which has no dtype of its own"
                )
            self.reference = policy
            self.sidecar = sidecar_for(
                policy, source="initial_policy", loader=f"{POLICY_LOADER}+{BASE_LOADER}"
            )
        elif ref.source == "initial_policy":
            self.reference = freeze(copy.deepcopy(policy)).to(self._reference_dtype)
            self.sidecar = sidecar_for(self.reference, source="initial_policy")
        else:
            spec = PinnedSnapshot(
                ref.repo, ref.revision, Path(ref.path), Path(ref.cache_dir) if ref.cache_dir else None
            )
            # the policy's attention, so both read a packed batch the same way (rk_varlen: one row)
            self.reference = load_pinned_reference(
                spec,
                dtype=self._reference_dtype,
                attn_implementation=policy.config._attn_implementation,
            )
            if self.reference.config.vocab_size != policy.config.vocab_size:
                raise ConfigError(
                    f"reference vocabulary {self.reference.config.vocab_size} != policy vocabulary"
                    f" {policy.config.vocab_size}: log-probs would be over different tokens"
                )
            self.sidecar = sidecar_for(
                self.reference, source="snapshot", repo=ref.repo, revision=ref.revision
            )

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
        from rewardkit.data.tokenize import template_sha256, tokenizer_sha256

        policy = build_policy(self.cfg, vocab_size=len(tokenizer))
        if len(tokenizer) > policy.config.vocab_size:
            raise ConfigError(
                f"tokenizer has {len(tokenizer)} tokens but the policy's vocabulary is {policy.config.vocab_size}"
            )
        check_policy_semantics(policy, allow_dropout=self.settings.allow_dropout)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_token_id = int(pad or 0)
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
            "tokenizer_sha256": tokenizer_sha256(tokenizer),
            "template_sha256": template_sha256(tokenizer),
            "attn_implementation": policy.config._attn_implementation,
            "max_length": self.cfg.data.max_length,
        }
        return policy

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

    def _prepare(self, device: torch.device) -> DPOObjective:
        """Move the reference next to the policy, or score everything once and free it."""
        if self.component is not None:
            return self.component
        s = self.settings
        if self.reference is None or not s.precompute_reference:
            if self.reference is not None:
                self.reference.to(device)
            self.component = DPOObjective(
                s, reference=self.reference, reference_context=self._reference_context
            )
            return self.component
        self.reference.to(device)
        cache_dir = Path(s.reference_cache_dir or Path(self.cfg.run.run_dir) / "reference_cache")
        common = {
            "cache_dir": cache_dir,
            "reference_digest": self.sidecar.param_sha256,
            "average": s.average_logps,
            "batch_size": s.reference_batch_size or self._micro_batch_pairs(),
            "layout": self.cfg.run.layout,
            "pad_token_id": self.pad_token_id,
            "context": self._reference_context,
        }
        train = precompute_reference(self.reference, self.train_pairs, data_digest=self.data_sha256, **common)
        if self.eval_pairs:
            self._eval_logps = precompute_reference(
                self.reference, self.eval_pairs, data_digest=self.eval_sha256 or "eval", **common
            )
        if not self._reference_is_policy:  # a LoRA policy's base is the policy: nothing to free
            release(self.reference)
        self.reference = None
        self.component = DPOObjective(s, reference_logps=train)
        return self.component

    def _micro_batch_pairs(self) -> int:
        """Pairs per training micro-batch: a reference pass at this size needs no more
        activation memory than training does (and with LoRA on `initial_policy` the pass runs
        on the policy itself, so a larger batch would set the run's peak)."""
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_initialized() else 1
        return max(1, self.cfg.run.global_batch_pairs // (world * self.cfg.run.grad_accum))

    # ---- the loop's protocol ----------------------------------------------------------
    def micro_batch(
        self, model: nn.Module, pairs: Sequence[TokenizedPair], device: torch.device
    ) -> MicroBatchOutput:
        component = self._prepare(device)
        batch = collate(
            pairs,
            layout=self.cfg.run.layout,
            pad_token_id=self.pad_token_id,
            max_length=self.cfg.data.max_length,
            row_length=packed_row_length(self.policy.config, self.cfg.data.max_length),
        ).to(device)
        losses, metrics = component.loss(model, batch, pairs)
        return MicroBatchOutput(
            loss_sum=losses.sum(),
            chosen=metrics["rewards/chosen"],
            rejected=metrics["rewards/rejected"],
            num_tokens=batch.num_tokens,
            num_slots=batch.num_slots,
            extra=metrics,
        )

    @torch.no_grad()
    def score(self, model: nn.Module, pairs: Sequence[TokenizedPair], batch_size: int):
        """Implicit rewards (chosen, rejected) and per-pair DPO losses, float64, input order."""
        device = next(model.parameters()).device
        component = self._prepare(device)
        if self._eval_logps is not None:
            component = DPOObjective(self.settings, reference_logps=self._eval_logps)
        was_training = model.training
        model.eval()
        s = self.settings
        chosen, rejected, losses = [], [], []
        try:
            for start in range(0, len(pairs), batch_size):
                chunk = pairs[start : start + batch_size]
                batch = collate(chunk, layout=self.cfg.run.layout, pad_token_id=self.pad_token_id).to(device)
                ref_c, ref_r = component.reference_batch(batch, chunk)
                pol_c, pol_r = batch_logps(model, batch, chunk, average=s.average_logps)
                m = dpo_metrics(pol_c, pol_r, ref_c, ref_r, beta=s.beta)
                chosen.append(m["rewards/chosen"].double().cpu().numpy())
                rejected.append(m["rewards/rejected"].double().cpu().numpy())
                loss = dpo_loss(
                    s.loss_type, pol_c, pol_r, ref_c, ref_r, beta=s.beta, label_smoothing=s.label_smoothing
                )
                losses.append(loss.double().cpu().numpy())
        finally:
            model.train(was_training)
        if not chosen:
            return np.zeros(0), np.zeros(0), np.zeros(0)
        return np.concatenate(chosen), np.concatenate(rejected), np.concatenate(losses)

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


def run(cfg: DPOTrainConfig, *, resume: str | None = None, allow_new_data: bool = False) -> RunResult:
    """Prepare data (the reward-model pipeline), train with the shared loop, checkpoint, evaluate."""
    from rewardkit.train.checkpoint import latest_checkpoint
    from rewardkit.train.recipes.reward_model import prepare_data

    data = prepare_data(cfg)
    objective = DPOPolicyObjective(
        cfg,
        train_pairs=data.train,
        data_sha256=data.data_sha256,
        eval_pairs=data.eval,
        eval_sha256=data.probe_sha256,
    )
    trainer = Trainer(
        cfg,
        objective,
        train_pairs=data.train,
        tokenizer=data.tokenizer,
        data_sha256=data.data_sha256,
        eval_set=EvalSet(data.eval, data.probe_sha256) if data.eval else None,
    )
    if resume == "auto":
        found = latest_checkpoint(Path(cfg.run.run_dir) / "checkpoints")
        resume = str(found) if found else None
    if resume:
        trainer.resume(resume, allow_new_data=allow_new_data)
    return trainer.fit()
