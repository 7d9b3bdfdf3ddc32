"""Adapters that let RL trainers call a rewardplane service unchanged (docs/integrations.md).

- `rewardplane.integrations.trl`: `RemoteReward` / `AsyncRemoteReward`, reward functions for TRL's
  `GRPOTrainer(reward_funcs=...)`.
- `rewardplane.integrations.verl`: `compute_score_async` / `compute_score` for verl's
  `custom_reward_function`, called by its Reward Loop's reward managers.

None of them imports its trainer: they only follow the trainer's calling convention, so they
import fast and work with any installed version of it that keeps that convention. Every adapter
keeps the service's rule: a failed score raises (or, where the trainer has a documented "no
reward" value and the caller asked for it, becomes that value); it never becomes a number.
"""
