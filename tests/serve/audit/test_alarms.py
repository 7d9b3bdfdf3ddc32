"""The alarms on simulated streams: they fire on what they are for, stay quiet on healthy
runs, decide from the past only, and their false-alarm rate under the null is what
docs/audit.md states (short versions of `benchmarks/overoptimization.py --part null`)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from rewardplane.serve.audit.alarms import Acc, BinStats, Evaluator
from rewardplane.serve.audit.config import AuditAlarms
from rewardplane.serve.audit.stats import kendall_tau, tilt_ahead, tilt_slope

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from audit_nulls import NULLS, false_alarms


def make_bin(b: int, proxy: np.ndarray, auditor: np.ndarray, sig: int = 0) -> BinStats:
    return BinStats(b, (b, b), proxy.size, Acc.of(proxy), {"gold": Acc.of(auditor)},
                    {"gold": kendall_tau(proxy, auditor)}, {"empty": sig},
                    {"gold": tilt_slope(proxy, auditor, seed=b, replicates=300)},
                    {"gold": (proxy, auditor)})  # fmt: skip


def tilted_run(bins: int, peak: int, n: int = 150, seed: int = 0) -> list[BinStats]:
    """A policy climbing the proxy: the auditor's within-bin slope on the proxy is positive
    before `peak` and negative after, so its mean rises to `peak` and falls after it."""
    rng = np.random.default_rng(seed)
    out, level = [], 0.0
    for b in range(bins):
        slope = 0.6 * (peak - b) / peak
        z = rng.normal(size=n)
        proxy = z + 0.08 * b
        level += 0.03 * slope
        out.append(make_bin(b, proxy, level + slope * z + rng.normal(size=n)))
    return out


def decisions(bins: list[BinStats], alarms: AuditAlarms | None = None) -> list:
    evaluator = Evaluator(["gold"], ["empty"], alarms or AuditAlarms())
    return [d for stats in bins for d in evaluator.add(stats)]


def first(made: list, alarm: str) -> int | None:
    return next((d.versions[1] for d in made if d.alarm == alarm and d.fired), None)


def test_overoptimization_fires_around_the_auditors_peak_not_long_after():
    for seed in range(3):
        fired = first(decisions(tilted_run(60, peak=30, seed=seed)), "overoptimization")
        assert fired is not None and 22 <= fired <= 34, fired


def test_level_evidence_alone_catches_the_fall_once_it_is_significant():
    alarms = AuditAlarms(overoptimization={"kappa": -1.0})  # slope evidence can never hold
    made = decisions(tilted_run(80, peak=30), alarms)
    fired = [d for d in made if d.alarm == "overoptimization" and d.fired]
    assert fired and fired[0].versions[1] > 30 and fired[0].evidence["by"] == ["level"]


def test_a_healthy_run_where_both_rise_together_raises_nothing():
    rng = np.random.default_rng(1)
    bins = []
    for b in range(200):
        z = rng.normal(size=150)
        bins.append(make_bin(b, z + 0.05 * b, 0.05 * b + 0.5 * z + rng.normal(size=150)))
    made = decisions(bins)
    assert not [d for d in made if d.fired]
    assert {d.alarm for d in made} == {"overoptimization", "decorrelation", "signature"}


def test_decorrelation_fires_when_the_proxy_ranks_against_the_auditor():
    rng = np.random.default_rng(2)
    against = [make_bin(b, z, -z + rng.normal(size=100)) for b, z in enumerate(rng.normal(size=(5, 100)))]
    assert first(decisions(against), "decorrelation") == 2  # the first full window
    agree = [make_bin(b, z, z + rng.normal(size=100)) for b, z in enumerate(rng.normal(size=(5, 100)))]
    assert first(decisions(agree), "decorrelation") is None


def test_signature_fires_above_its_threshold_or_rising_from_its_start():
    rng = np.random.default_rng(3)

    def run(rates: list[float], n: int = 200) -> list:
        return decisions([make_bin(b, rng.normal(size=n), rng.normal(size=n), int(rng.binomial(n, r)))
                          for b, r in enumerate(rates)])  # fmt: skip

    above = [d for d in run([0.2] * 4) if d.alarm == "signature" and d.fired]
    assert above and above[0].evidence["by"] == ["above"]
    rising = [d for d in run([0.0] * 3 + [0.05] * 6, n=500) if d.alarm == "signature" and d.fired]
    assert rising and rising[0].evidence["by"] == ["rising"]
    assert first(run([0.01] * 30), "signature") is None


def test_each_decision_depends_only_on_the_bins_before_it():
    bins = tilted_run(40, peak=20, seed=5)
    made = decisions(bins)
    for b in (9, 21, 39):
        fresh = [d for d in decisions(bins[: b + 1]) if d.bin == b]
        assert [(d.alarm, d.fired, d.evidence) for d in fresh] == [
            (d.alarm, d.fired, d.evidence) for d in made if d.bin == b
        ]


@pytest.mark.parametrize("null", [n for n in NULLS if n.name in ("plateau", "plateau, unrelated auditor")])
def test_false_alarm_rate_under_the_null_is_low_at_the_defaults_and_moves_with_the_levels(null):
    rates = false_alarms(null, AuditAlarms(), runs=2, bins=600, n=100, seed=4)
    assert rates["overoptimization"] <= 5 and rates["decorrelation"] <= 5  # per 1,000 bins
    loose = AuditAlarms(
        overoptimization={"alpha_rise": 0.2, "kappa": 0.5}, decorrelation={"alpha": 0.3, "threshold": 0.35}
    )
    loose_rates = false_alarms(null, loose, runs=2, bins=600, n=100, seed=4)
    assert loose_rates["overoptimization"] > 20 and loose_rates["decorrelation"] > 20


def length_world_bins(versions: int, step: float, rng: np.random.Generator, n: int):
    """A policy π_v ∝ exp(β_v·proxy) over a pool whose proxy buys length the auditor punishes
    (benchmarks/audit_worlds.py's `length`), β_v = step·v; the bins and each version's true tilt
    slope (the pool's, under π_v)."""
    quality, length = rng.normal(size=40_000), rng.gamma(2.0, 1.5, size=40_000)
    proxy, gold = quality + 0.4 * length, quality - 0.08 * np.maximum(0.0, length - 4.0) ** 2
    bins, true = [], []
    for v in range(versions):
        w = np.exp(step * v * (proxy - proxy.max()))
        w /= w.sum()
        dp, dg = proxy - w @ proxy, gold - w @ gold
        true.append(float(w @ (dp * dg) / np.sqrt((w @ dp**2) * (w @ dg**2))))
        picks = rng.choice(proxy.size, size=n, p=w)
        bins.append(make_bin(v, proxy[picks], gold[picks]))
    return bins, true


def test_the_forecast_fires_before_the_tilt_slope_crosses_zero_where_the_level_alone_does_not():
    for seed in range(3):
        bins, true = length_world_bins(24, 0.03, np.random.default_rng(seed), n=300)
        crossing = next(v for v, r in enumerate(true) if r < 0)  # the gold peak of this policy
        made = [d for d in decisions(bins) if d.alarm == "overoptimization" and d.fired]
        assert made and made[0].evidence["by"] == ["forecast"]
        assert made[0].versions[1] < crossing, (seed, made[0].evidence, crossing)
        level_only = first(decisions(bins, AuditAlarms(overoptimization={"horizon": 0})), "overoptimization")
        assert level_only is None or level_only > made[0].versions[1]  # the forecast decided earlier


def test_the_forecast_stays_quiet_on_a_flat_positive_slope_while_the_proxy_rises():
    rng = np.random.default_rng(7)
    bins = []
    for b in range(60):  # a normal pair tilted toward the proxy: the means move, the covariance not
        z = rng.normal(size=150)
        bins.append(make_bin(b, z + 0.1 * b, 0.03 * b + 0.3 * z + 0.95 * rng.normal(size=150)))
    made = [d for d in decisions(bins) if d.alarm == "overoptimization"]
    forecasts = [d.evidence["tilt_forecast"] for d in made if d.evidence["tilt_forecast"] is not None]
    assert len(forecasts) >= 0.8 * len(made) and 0.2 < np.median(forecasts) < 0.4  # it was made
    assert first(made, "overoptimization") is None


def test_tilt_ahead_is_the_tilt_slope_at_zero_and_the_tilted_pools_slope_ahead():
    rng = np.random.default_rng(11)
    quality, length = rng.normal(size=200_000), rng.gamma(2.0, 1.5, size=200_000)
    proxy, gold = quality + 0.4 * length, quality - 0.08 * np.maximum(0.0, length - 4.0) ** 2
    now = tilt_ahead(proxy[:400], gold[:400], 0.0)
    assert now.point == pytest.approx(tilt_slope(proxy[:400], gold[:400], seed=0, replicates=2000).point)
    ahead = tilt_ahead(proxy, gold, 0.4)  # the pool tilted by 0.4, in the untilted pool's sds
    w = np.exp(0.4 * (proxy - proxy.max()))
    w /= w.sum()
    cov = w @ ((proxy - w @ proxy) * (gold - w @ gold))
    assert ahead.point == pytest.approx(cov / (proxy.std(ddof=1) * gold.std(ddof=1)), rel=1e-3)
    assert ahead.point < 0 < now.point and ahead.se > 0


def test_the_boost_watches_a_rising_proxy_whose_tilt_runs_low_and_only_when_asked():
    from rewardplane.serve.audit.alarms import Decision, watching
    from rewardplane.serve.audit.config import Boost

    def decision(z: float, tilt: float, forecast: float | None = None, fired: bool = False) -> Decision:
        evidence = {"z_proxy_rise": z, "tilt": tilt, "tilt_forecast": forecast}
        return Decision("overoptimization", "gold", 7, (10, 12), fired, evidence)

    start_only, watch = Boost(), Boost(watch=0.3)
    assert not watching(decision(5.0, 0.1), start_only)  # the default boosts an epoch's start only
    assert not watching(decision(1.0, 0.5, fired=True), start_only)  # never by the statistics
    assert watching(decision(1.0, 0.5, fired=True), watch)  # with watch, a firing alarm keeps it
    assert watching(decision(5.0, 0.1), watch)
    assert watching(decision(5.0, 0.6, forecast=0.2), watch)  # the forecast is low
    assert not watching(decision(5.0, 0.6, forecast=0.4), watch)  # moving toward the proxy still pays
    assert not watching(decision(2.0, 0.1), watch)  # z 2.0 < z(0.005): the proxy is not clearly rising
    assert not watching(Decision("decorrelation", "gold", 7, (10, 12), False, {}), watch)
