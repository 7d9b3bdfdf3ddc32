"""Losses against hand-computed values and TRL's formulas written out independently."""

import math

import pytest
import torch

from rewardplane.objectives.losses import bradley_terry, center_rewards_penalty, dpo_loss, dpo_rewards


def _ls(x: float) -> float:
    return -math.log1p(math.exp(-x))  # log sigmoid


def test_bradley_terry_hand_values():
    c = torch.tensor([1.0, 0.0, -2.0], dtype=torch.float64)
    r = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    m = torch.tensor([0.5, 0.0, 0.0], dtype=torch.float64)
    got = bradley_terry(c, r, m)
    want = [-_ls(0.5), math.log(2.0), -_ls(-3.0)]
    assert got.tolist() == pytest.approx(want, abs=1e-12)


def test_bradley_terry_matches_trl_with_centering():
    torch.manual_seed(0)
    c, r, m = torch.randn(8), torch.randn(8), torch.rand(8)
    coef = 0.01
    trl = -torch.nn.functional.logsigmoid(c - r - m).mean() + coef * torch.mean((c + r) ** 2)
    ours = (bradley_terry(c, r, m) + center_rewards_penalty(c, r, coef)).sum() / 8
    assert abs(float(trl - ours)) < 1e-6


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo", "hinge", "robust", "reference_free"])
def test_dpo_losses_match_trl_formulas(loss_type):
    torch.manual_seed(1)
    pc, pr, rc, rr = (torch.randn(6, dtype=torch.float64) * 3 for _ in range(4))
    beta, eps = 0.1, 0.1 if loss_type == "robust" else 0.0
    ref_logratios = torch.zeros(6, dtype=torch.float64) if loss_type == "reference_free" else rc - rr
    logits = (pc - pr) - ref_logratios
    ls = torch.nn.functional.logsigmoid
    expected = {
        "sigmoid": -ls(beta * logits),
        "reference_free": -ls(beta * logits),
        "robust": (-ls(beta * logits) * (1 - eps) + ls(-beta * logits) * eps) / (1 - 2 * eps),
        "hinge": torch.relu(1 - beta * logits),
        "ipo": (logits - 1 / (2 * beta)) ** 2,
    }[loss_type]
    got = dpo_loss(loss_type, pc, pr, rc, rr, beta=beta, label_smoothing=eps)
    assert torch.allclose(got, expected, atol=1e-6, rtol=0)


def test_dpo_sigmoid_hand_value():
    # z = (−1 − −3) − (−2 − −2) = 2; β = 0.5 → −log σ(1)
    got = dpo_loss(
        "sigmoid",
        torch.tensor([-1.0]),
        torch.tensor([-3.0]),
        torch.tensor([-2.0]),
        torch.tensor([-2.0]),
        beta=0.5,
    )
    assert float(got) == pytest.approx(-_ls(1.0), abs=1e-6)


def test_dpo_rewards_and_errors():
    r = dpo_rewards(torch.tensor([-1.0]), torch.tensor([-3.0]), beta=0.1)
    assert float(r) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="needs reference"):
        dpo_loss("sigmoid", torch.zeros(1), torch.zeros(1), None, None, beta=0.1)
    with pytest.raises(ValueError, match="unknown DPO loss"):
        dpo_loss("kto", torch.zeros(1), torch.zeros(1), None, None, beta=0.1)  # type: ignore[arg-type]
