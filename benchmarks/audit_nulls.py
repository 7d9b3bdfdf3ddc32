"""Streams under the null, to measure each alarm's false-alarm rate (docs/audit.md's table).

A null stream is a run where nothing is being gamed: bins of `n` audited items whose proxy and
auditor scores are drawn from a fixed (or steadily improving) joint distribution. Every bin goes
through the same `alarms.Evaluator` the service uses; a false alarm is a bin at which a rule
fires. `benchmarks/overoptimization.py --part null` prints the table; the tests run short versions.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from rewardplane.serve.audit.alarms import Acc, BinStats, Evaluator
from rewardplane.serve.audit.config import AuditAlarms
from rewardplane.serve.audit.stats import kendall_tau, tilt_slope

REPLICATES = 500
"""Bootstrap replicates of each bin's tilt slope (the service's default is 2,000; 500 keep the
simulation fast and its standard error within a few percent)."""


@dataclass(frozen=True)
class Null:
    """One null scenario: per-item (proxy, auditor) ~ bivariate normal with correlation `rho`,
    means drifting by `proxy_step` / `auditor_step` per bin (0: a plateau); a `binary` auditor
    is 1[z > threshold] with P(1) = `rate`; each signature occurs with probability `signature_rate`."""

    name: str
    rho: float = 0.3
    proxy_step: float = 0.0
    auditor_step: float = 0.0
    binary: bool = False
    rate: float = 0.5
    signature_rate: float = 0.01


NULLS = (
    Null("plateau", rho=0.3),
    Null("plateau, unrelated auditor", rho=0.0),
    Null("plateau, binary auditor at 0.95", rho=0.3, binary=True, rate=0.95),
    Null("both improving", rho=0.3, proxy_step=0.02, auditor_step=0.02),
    Null("signature at the threshold", rho=0.3, signature_rate=0.05),
)


def null_bins(null: Null, bins: int, n: int, rng: np.random.Generator) -> list[BinStats]:
    from statistics import NormalDist

    cut = NormalDist().inv_cdf(1.0 - null.rate)
    out = []
    cov = [[1.0, null.rho], [null.rho, 1.0]]
    for b in range(bins):
        z = rng.multivariate_normal([0.0, 0.0], cov, size=n)
        proxy = z[:, 0] + b * null.proxy_step
        auditor = (z[:, 1] > cut).astype(np.float64) if null.binary else z[:, 1] + b * null.auditor_step
        sig = int(rng.binomial(n, null.signature_rate))
        out.append(
            BinStats(
                index=b,
                versions=(b, b),
                n=n,
                proxy=Acc.of(proxy),
                auditors={"auditor": Acc.of(auditor)},
                taus={"auditor": kendall_tau(proxy, auditor)},
                signatures={"sig": sig},
                slopes={"auditor": tilt_slope(proxy, auditor, seed=b, replicates=REPLICATES)},
                scores={"auditor": (proxy, auditor)},
            )
        )
    return out


def false_alarms(
    null: Null, alarms: AuditAlarms, *, runs: int, bins: int, n: int, seed: int = 0
) -> dict[str, float]:
    """Bins at which each alarm fired, per 1,000 bins, over `runs` runs of `bins` bins."""
    rng = np.random.default_rng(seed)
    fired: Counter[str] = Counter()
    for _ in range(runs):
        evaluator = Evaluator(["auditor"], ["sig"], alarms)
        for stats in null_bins(null, bins, n, rng):
            for decision in evaluator.add(stats):
                fired[decision.alarm] += decision.fired
    total = runs * bins
    return {
        alarm: 1000.0 * fired[alarm] / total for alarm in ("overoptimization", "decorrelation", "signature")
    }
