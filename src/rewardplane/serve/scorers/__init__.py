"""Scorers the service can host: one module per kind, listed in `registry.py`'s `BUILTIN_SCORERS`;
other packages add kinds through the `rewardplane.scorers` entry points."""
