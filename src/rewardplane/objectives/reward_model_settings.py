"""The `loss:` config section of `rewardplane train rm`: `RewardModelSettings`.

Plain pydantic, no torch: the whole train config, this section included, is read and checked
before the objective (`rewardplane.objectives.reward_model`) and torch are imported, so an
unknown key or a bad value is answered at once. docs/training.md lists the keys.
"""

from __future__ import annotations

from rewardplane.core.config import ConfigModel


class RewardModelSettings(ConfigModel):
    """The `loss:` config section: TRL's optional centring term and Llama-2 style margins."""

    center_rewards_coefficient: float = 0.0
    use_margin: bool = True  # subtract a pair's `margin` inside the sigmoid (Llama-2 style)
