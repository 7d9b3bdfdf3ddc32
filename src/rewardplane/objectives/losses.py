"""Pairwise losses: Bradley–Terry for reward models and the DPO family for policies.

Every function returns a **per-pair** loss tensor (no reduction). The training loop sums
per-pair losses and divides by the global number of pairs in the optimizer step, across
data-parallel ranks and gradient-accumulation micro-batches, so the gradient of a fixed
global batch does not depend on how it was split. The formulas follow TRL's
`RewardTrainer` and `DPOTrainer` exactly (see tests/test_losses.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rewardplane.objectives.dpo_settings import DPO_LOSS_TYPES, DPOLossType


def bradley_terry(
    chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | None = None
) -> torch.Tensor:
    """-log σ(s_c − s_r − margin), per pair."""
    diff = chosen - rejected
    if margin is not None:
        diff = diff - margin
    return -F.logsigmoid(diff)


def center_rewards_penalty(chosen: torch.Tensor, rejected: torch.Tensor, coefficient: float) -> torch.Tensor:
    """Per-pair form of TRL's `center_rewards_coefficient * mean((s_c + s_r)^2)`.

    Summed over pairs and divided by the pair count this equals TRL's batch-mean term.
    """
    return coefficient * (chosen + rejected) ** 2


def dpo_logits(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor | None,
    reference_rejected: torch.Tensor | None,
) -> torch.Tensor:
    """(log π_c − log π_r) − (log π_ref_c − log π_ref_r); the reference term is 0 when absent."""
    logits = policy_chosen - policy_rejected
    if reference_chosen is not None and reference_rejected is not None:
        logits = logits - (reference_chosen - reference_rejected)
    return logits


def dpo_loss(
    loss_type: DPOLossType,
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor | None,
    reference_rejected: torch.Tensor | None,
    *,
    beta: float,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Per-pair DPO-family loss on sequence log-probabilities.

    - `sigmoid`: −(1−ε)·log σ(βz) − ε·log σ(−βz) (standard DPO; ε = label smoothing, cDPO)
    - `robust`: [−(1−ε)·log σ(βz) + ε·log σ(−βz)] / (1 − 2ε)  (Chowdhury et al. 2024)
    - `hinge`: relu(1 − βz)  (SLiC)
    - `ipo`: (z − 1/(2β))²  (Azar et al.; pass length-averaged log-probs, as TRL does)
    - `reference_free`: the sigmoid loss with the reference log-ratio fixed at 0
    """
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"unknown DPO loss {loss_type!r}; choose one of {', '.join(DPO_LOSS_TYPES)}")
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if loss_type == "reference_free":
        reference_chosen = reference_rejected = None
    elif reference_chosen is None or reference_rejected is None:
        raise ValueError(f"loss {loss_type!r} needs reference log-probabilities")
    z = dpo_logits(policy_chosen, policy_rejected, reference_chosen, reference_rejected)
    if loss_type in ("sigmoid", "reference_free"):
        return -F.logsigmoid(beta * z) * (1 - label_smoothing) - F.logsigmoid(-beta * z) * label_smoothing
    if loss_type == "robust":
        if not 0 <= label_smoothing < 0.5:
            raise ValueError("robust DPO needs 0 <= label_smoothing < 0.5")
        return (
            -F.logsigmoid(beta * z) * (1 - label_smoothing) + F.logsigmoid(-beta * z) * label_smoothing
        ) / (1 - 2 * label_smoothing)
    if loss_type == "hinge":
        return torch.relu(1 - beta * z)
    return (z - 1 / (2 * beta)) ** 2


def dpo_rewards(policy: torch.Tensor, reference: torch.Tensor | None, *, beta: float) -> torch.Tensor:
    """Implicit reward β·(log π − log π_ref), detached (TRL's `rewards/chosen|rejected`)."""
    ref = reference if reference is not None else torch.zeros_like(policy)
    return (beta * (policy - ref)).detach()
