"""Scorers the service can host; third parties add more through the `rewardplane.scorers` entry points."""
