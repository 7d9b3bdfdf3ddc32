"""Scorers the service can host; third parties add more through the `rewardkit.scorers` entry points."""
