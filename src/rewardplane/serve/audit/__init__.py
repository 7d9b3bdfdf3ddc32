"""Know when the policy games the reward: the audit stream and its alarms (docs/audit.md).

- `config`: the service config's `audit:` section (`AuditConfig`).
- `sampler`: which scored items are audited, under which (epoch, version): the request path's
  part, per request and per (version, group).
- `stream`: `AuditStream`, the bounded queue the sampler's picks go to, and the workers that
  re-score them with the auditors.
- `ledger`: one epoch's audited items by policy version, closed into bins, with their summaries.
- `stats`: the tilt slope (standardised covariance) with its bootstrap interval, Kendall's τ_b
  (a diagnostic) with a jackknife interval, Wilson bounds, the evaluation's bootstrap.
- `alarms`: `overoptimization`, `decorrelation`, `signature`, each a stated one-sided test.
- `signatures`: hack signatures read from a response's text.
- `metrics`: the Prometheus gauges and counters.
"""

from rewardplane.serve.audit.config import AuditConfig
from rewardplane.serve.audit.stream import AuditStream

__all__ = ["AuditConfig", "AuditStream"]
