"""The three alarms, as pure functions of the closed bins (docs/audit.md "Alarms").

A bin is a run of consecutive policy versions with at least `min_items` audited items (one
version when a version has that many). Each rule is evaluated once per bin, when it closes, on
that bin and the bins before it, so a decision never looks ahead; R is the window of the last
`window` bins and Prev the window before it. All tests are one-sided, at the configured levels.

`overoptimization` (per auditor) fires when any of these holds:

- slope: the proxy is still rising (mean over R above mean over Prev, Welch z ≥ z(alpha_rise);
  Prev ends `rise_gap` bins before R starts, once there are that many, so a slow steady rise
  adds up to evidence)
  and among the policy's own samples moving toward the proxy no longer raises the auditor: the
  upper bound (level alpha_slope) of the tilt slope within the bins of R — the standardised
  covariance of proxy and auditor (`stats.tilt_slope`) — is below `kappa`. For a policy tilted
  toward the proxy (π_β ∝ π·exp(β·proxy), what KL-regularised RL converges to)
  d E_β[auditor] / dβ = Cov_β(proxy, auditor): the auditor's mean stops rising exactly when the
  covariance reaches zero, so it marks the auditor's peak as it happens rather than after the
  fall. τ is reported beside it, never tested: ties and near-ties move τ, not the covariance;
- forecast: the proxy is rising (as for slope) and the upper bound (level alpha_slope) of the
  tilt slope `horizon` versions ahead is below `kappa`: each bin of R reweighted by
  exp(Δβ·proxy) to the policy that far ahead (`stats.tilt_ahead`), Δβ at the slowest pace the
  proxy's rise supports (d E_β[proxy]/dβ = Var_β(proxy)); not used when the auditor rose
  significantly beyond what that proxy tilt predicts (Cov·Δβ), i.e. when more than the proxy
  moves the policy;
- level: the auditor's mean over R is below its best earlier window's (Welch z ≥
  z(alpha_level)) while the proxy's mean over R is above its mean in that same window
  (z ≥ z(alpha_rise)): "the proxy rising while the auditor falls below its running peak".

`decorrelation` (per auditor): the upper bound (level alpha) of the tilt slope within the bins
of R is below `threshold` (default 0: tilting the policy toward the proxy lowers the auditor).

`signature` (per signature): the one-sided Wilson lower bound (level alpha) of its rate over R
is above `max_rate`, or above the first window's Wilson upper bound plus `min_rise`.

The false-alarm rate of each rule under the null is measured by simulation
(`benchmarks/audit_nulls.py`, docs/audit.md's table).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from rewardplane.serve.audit.config import AuditAlarms
from rewardplane.serve.audit.stats import (
    Estimate,
    Moments,
    pool,
    tilt_ahead,
    welch_z,
    wilson,
    z_of,
)


@dataclass
class Acc:
    """Sufficient statistics of a sample (n, Σx, Σx²), added across bins."""

    n: int = 0
    s: float = 0.0
    ss: float = 0.0

    @staticmethod
    def of(values: np.ndarray) -> Acc:
        values = np.asarray(values, dtype=np.float64)
        values = values[np.isfinite(values)]
        return Acc(int(values.size), float(values.sum()), float(np.dot(values, values)))

    def __add__(self, other: Acc) -> Acc:
        return Acc(self.n + other.n, self.s + other.s, self.ss + other.ss)

    def moments(self) -> Moments | None:
        if self.n == 0:
            return None
        mean = self.s / self.n
        if self.n == 1:
            return Moments(1, mean, math.inf)
        var = max(0.0, (self.ss - self.n * mean * mean) / (self.n - 1))
        return Moments(self.n, mean, math.sqrt(var / self.n))


@dataclass
class BinStats:
    """What the alarms read from one closed bin."""

    index: int
    versions: tuple[int, int]
    n: int
    proxy: Acc
    auditors: dict[str, Acc]
    taus: dict[str, Estimate | None]  # a diagnostic, reported with the decisions
    signatures: dict[str, int]  # items carrying each signature
    slopes: dict[str, Estimate | None] = field(default_factory=dict)  # what the rules test
    scores: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    """(proxy, auditor) of the bin's items per auditor, for the forecast; kept for the newest
    window only."""


@dataclass
class Decision:
    """One rule's verdict at one bin, with the numbers it was made from."""

    alarm: str
    subject: str
    bin: int
    versions: tuple[int, int]
    fired: bool
    evidence: dict[str, Any] = field(default_factory=dict)


def _pool(bins: list[BinStats], get: Any) -> Acc:
    total = Acc()
    for b in bins:
        total = total + get(b)
    return total


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(float(value), 6)


@dataclass
class Peak:
    """The auditor's best window so far among those that end before the current window starts
    (kept incrementally: each new bin makes one more window eligible)."""

    end: int = -1
    mean: float = -math.inf

    def update(self, bins: list[BinStats], auditor: str, w: int) -> None:
        end = len(bins) - 1 - w  # the window ending just before R
        if end < w - 1:
            return
        m = _pool(bins[end - w + 1 : end + 1], lambda x: x.auditors[auditor]).moments()
        if m is not None and m.mean > self.mean:
            self.end, self.mean = end, m.mean


def overoptimization(bins: list[BinStats], auditor: str, rule: Any, peak: Peak) -> Decision | None:
    """The rule at the last bin; `peak` must have been updated with these bins."""
    w, b = rule.window, len(bins) - 1
    if len(bins) < 2 * w:
        return None
    gap = min(rule.rise_gap, len(bins) - 2 * w)  # as much of the gap as the bins so far allow
    recent, before = bins[-w:], bins[len(bins) - 2 * w - gap : len(bins) - w - gap]
    proxy_r = _pool(recent, lambda x: x.proxy).moments()
    proxy_p = _pool(before, lambda x: x.proxy).moments()
    aud_r = _pool(recent, lambda x: x.auditors[auditor]).moments()
    if proxy_r is None or proxy_p is None or aud_r is None:
        return None
    z_rise = welch_z(proxy_r, proxy_p)
    rising = z_rise >= z_of(rule.alpha_rise)
    tilt = pool([x.slopes.get(auditor) for x in recent])
    tilt_upper = tilt.upper(rule.alpha_slope) if tilt is not None else None
    slope = rising and tilt_upper is not None and tilt_upper < rule.kappa
    ahead_hit, ahead = _forecast_evidence(recent, before, auditor, rule, z_rise) if rising else (False, {})
    tau = pool([x.taus.get(auditor) for x in recent])
    z_drop = z_above_peak = None
    level = False
    peak_versions = None
    if peak.end >= 0:
        window = bins[peak.end - w + 1 : peak.end + 1]
        aud_peak = _pool(window, lambda x: x.auditors[auditor]).moments()
        proxy_peak = _pool(window, lambda x: x.proxy).moments()
        peak_versions = (window[0].versions[0], window[-1].versions[1])
        if aud_peak is not None and proxy_peak is not None:
            z_drop = welch_z(aud_peak, aud_r)
            z_above_peak = welch_z(proxy_r, proxy_peak)
            level = z_drop >= z_of(rule.alpha_level) and z_above_peak >= z_of(rule.alpha_rise)
    evidence = {
        "proxy_mean": _finite(proxy_r.mean),
        "auditor_mean": _finite(aud_r.mean),
        "z_proxy_rise": _finite(z_rise),
        "tilt": _finite(tilt.point) if tilt is not None else None,
        "tilt_upper": _finite(tilt_upper),
        **{key: ahead.get(key) for key in FORECAST_KEYS},
        "tau": _finite(tau.point) if tau is not None else None,
        "peak_versions": list(peak_versions) if peak_versions else None,
        "z_auditor_below_peak": _finite(z_drop),
        "z_proxy_above_peak": _finite(z_above_peak),
        "by": [name for name, hit in (("slope", slope), ("forecast", ahead_hit), ("level", level)) if hit],
    }
    return Decision("overoptimization", auditor, b, _span(recent), slope or ahead_hit or level, evidence)


FORECAST_KEYS = ("tilt_forecast", "tilt_forecast_upper", "tilt_pace", "z_auditor_beyond_tilt")


def _forecast_evidence(
    recent: list[BinStats], before: list[BinStats], auditor: str, rule: Any, z_rise: float
) -> tuple[bool, dict[str, Any]]:
    """The forecast evidence, once the proxy rises significantly (docs/audit.md): whether the
    upper bound of the tilt slope `horizon` versions ahead is below κ, and its numbers."""
    windows = [_pool(w, lambda x: x.proxy).moments() for w in (recent, before)]
    auditors = [_pool(w, lambda x: x.auditors[auditor]).moments() for w in (recent, before)]
    tilts = [pool([x.slopes.get(auditor) for x in w]) for w in (recent, before)]
    if rule.horizon <= 0 or None in windows or None in auditors or None in tilts:
        return False, {}
    (pr, pp), (ar, ap), (tr, tp) = windows, auditors, tilts
    rise = pr.mean - pp.mean
    # A proxy tilt moves the auditor by Cov(proxy, auditor)·Δβ with Δβ = rise/Var(proxy). An
    # auditor rising significantly beyond that is being optimised by more than the proxy (the
    # control: a policy after the auditor itself), and a proxy tilt's forecast does not apply.
    cov = (_sd(pr) * _sd(ar) * tr.point + _sd(pp) * _sd(ap) * tp.point) / 2
    predicted = cov * rise / ((_sd(pr) ** 2 + _sd(pp) ** 2) / 2)
    beyond = welch_z(ar, ap) - predicted / math.sqrt(ar.se**2 + ap.se**2)
    out: dict[str, Any] = {"z_auditor_beyond_tilt": _finite(beyond)}
    if not beyond < z_of(rule.alpha_slope):
        return False, out
    # the slowest pace the proxy's rise supports: its lower bound at alpha_slope, rise·(1 − z_α/z)
    pace = _tilt_pace(recent, before, auditor, rise * (1.0 - z_of(rule.alpha_slope) / z_rise))
    forecast = _forecast(recent, auditor, pace, rule.horizon) if pace else None
    if forecast is None:
        return False, out
    upper = forecast.upper(rule.alpha_slope)
    out.update(
        tilt_forecast=_finite(forecast.point), tilt_forecast_upper=_finite(upper), tilt_pace=_finite(pace)
    )
    return upper < rule.kappa, out


def _sd(m: Moments) -> float:
    return m.se * math.sqrt(m.n) if math.isfinite(m.se) else 0.0


def _centre(bins: list[BinStats]) -> float:
    """The item-weighted mean version of a window's bins (each bin at its versions' midpoint)."""
    total = sum(x.n for x in bins)
    return sum(x.n * (x.versions[0] + x.versions[1]) / 2 for x in bins) / max(1, total)


def _tilt_pace(recent: list[BinStats], before: list[BinStats], auditor: str, rise: float) -> float | None:
    """β gained per version, from a rise of the proxy's mean between the two windows:
    d E_β[proxy]/dβ = Var_β(proxy), so the rise over R's within-bin variance, per version
    between the windows' centres (None when the rise is not positive or the variance unknown)."""
    span = _centre(recent) - _centre(before)
    var = [float(np.var(x.scores[auditor][0], ddof=1)) for x in recent if auditor in x.scores]
    if span <= 0 or rise <= 0 or not var or not np.mean(var) > 0:
        return None
    return rise / float(np.mean(var)) / span


def _forecast(recent: list[BinStats], auditor: str, pace: float, horizon: int) -> Estimate | None:
    """The tilt slope `horizon` versions past R's newest, at `pace`: each bin of R reweighted to
    it from its own versions (`stats.tilt_ahead`), pooled."""
    target = recent[-1].versions[1] + horizon
    ahead = [
        tilt_ahead(*x.scores[auditor], pace * (target - _centre([x]))) for x in recent if auditor in x.scores
    ]
    return pool(ahead)


def decorrelation(bins: list[BinStats], auditor: str, rule: Any) -> Decision | None:
    if len(bins) < rule.window:
        return None
    recent = bins[-rule.window :]
    tilt = pool([x.slopes.get(auditor) for x in recent])
    if tilt is None:
        return None
    upper = tilt.upper(rule.alpha)
    tau = pool([x.taus.get(auditor) for x in recent])
    evidence = {"tilt": _finite(tilt.point), "tilt_upper": _finite(upper), "n": tilt.n,
                "tau": _finite(tau.point) if tau is not None else None}  # fmt: skip
    return Decision("decorrelation", auditor, len(bins) - 1, _span(recent), upper < rule.threshold, evidence)


def signature(bins: list[BinStats], name: str, rule: Any) -> Decision | None:
    w = rule.window
    if len(bins) < w:
        return None
    recent, first = bins[-w:], bins[:w]
    k, n = sum(x.signatures.get(name, 0) for x in recent), sum(x.n for x in recent)
    if n == 0:
        return None
    low, _ = wilson(k, n, rule.alpha)
    above = low > rule.max_rate
    rising = False
    base_upper = None
    if len(bins) >= 2 * w:
        _, base_upper = wilson(
            sum(x.signatures.get(name, 0) for x in first), sum(x.n for x in first), rule.alpha
        )
        rising = low > base_upper + rule.min_rise
    evidence = {
        "rate": _finite(k / n),
        "rate_lower": _finite(low),
        "first_window_upper": _finite(base_upper),
        "by": [label for label, hit in (("above", above), ("rising", rising)) if hit],
    }
    return Decision("signature", name, len(bins) - 1, _span(recent), above or rising, evidence)


def watching(decision: Decision, boost: Any) -> bool:
    """Whether an `overoptimization` decision calls for more samples (the config's `boost`, with
    `watch` set): it fired, or the proxy rises (at boost's looser level) while the tilt slope or its forecast is
    below `watch` — the auditor gains less and less from the proxy's rise, which is where the
    slope and forecast evidence decide, and where their intervals are the whole question."""
    if decision.alarm != "overoptimization" or boost.watch is None:
        return False  # the default boost follows the epoch's bins alone, never the statistics
    if decision.fired:
        return True
    ev = decision.evidence
    z_rise = ev.get("z_proxy_rise")
    lows = [x for x in (ev.get("tilt"), ev.get("tilt_forecast")) if x is not None]
    return z_rise is not None and z_rise >= z_of(boost.alpha_rise) and bool(lows) and min(lows) < boost.watch


def _span(bins: list[BinStats]) -> tuple[int, int]:
    return bins[0].versions[0], bins[-1].versions[1]


class Evaluator:
    """Closed bins in order, and each rule's decision as every bin closes."""

    def __init__(self, auditors: list[str], signatures: list[str], alarms: AuditAlarms) -> None:
        self.auditors = auditors
        self.signatures = signatures
        self.alarms = alarms
        self.bins: list[BinStats] = []
        self.peaks = {a: Peak() for a in auditors}

    def add(self, stats: BinStats) -> list[Decision]:
        """Close one more bin; every enabled rule's decision there (none before a rule has
        enough bins)."""
        self.bins.append(stats)
        rules = self.alarms
        keep = rules.overoptimization.window
        if len(self.bins) > keep:
            # the forecast reads the newest window's items only (a copy: the caller's bin stays whole)
            self.bins[-keep - 1] = replace(self.bins[-keep - 1], scores={})
        decisions: list[Decision | None] = []
        if rules.overoptimization.enabled:
            for a in self.auditors:
                self.peaks[a].update(self.bins, a, rules.overoptimization.window)
                decisions.append(overoptimization(self.bins, a, rules.overoptimization, self.peaks[a]))
        if rules.decorrelation.enabled:
            decisions += [decorrelation(self.bins, a, rules.decorrelation) for a in self.auditors]
        if rules.signature.enabled:
            decisions += [signature(self.bins, s, rules.signature) for s in self.signatures]
        return [d for d in decisions if d is not None]
