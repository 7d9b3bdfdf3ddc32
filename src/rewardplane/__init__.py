"""rewardplane: train, evaluate, serve and qualify reward models for RL post-training."""

__version__ = "0.2.0"
