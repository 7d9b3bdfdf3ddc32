"""Audited items by policy version, closed into bins, with their summaries (docs/audit.md).

`Ledger.record` takes audited items (any version, any order); `Ledger.settle` closes every
bin whose versions are final and returns the alarm decisions made there. A version is final
once an item `settle_versions` newer has been recorded; final versions are taken in version
order and merged into bins of at least `min_items` items, so each bin is one stretch of a
policy that barely changed. An item for a version that was already binned is still counted in
that version's statistics (`late`), never in a closed bin: each decision is made once.

Memory is bounded: at most `max_items_per_version` items per version (a uniform reservoir),
raw items only for the newest `keep_versions` versions, and a bin keeps sufficient statistics
and its intervals, not its items.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rewardplane.core.resample import replicate_means
from rewardplane.serve.audit.alarms import Acc, BinStats, Decision, Evaluator
from rewardplane.serve.audit.config import AuditConfig
from rewardplane.serve.audit.signatures import SIGNATURES
from rewardplane.serve.audit.stats import (
    Estimate,
    interval,
    kendall_tau,
    mean_replicates,
    tilt_estimate,
    tilt_products,
    tilt_slope,
)

NO_SOURCE = ""


@dataclass(frozen=True)
class Audited:
    """One audited item: its proxy score, each auditor's (NaN when that auditor failed on it),
    response length, whether it hit the length cap, and its signature bit mask."""

    version: int
    source: str
    proxy: float
    auditors: dict[str, float]
    length: int
    at_cap: bool
    signatures: int
    epoch: int = 0


@dataclass
class _Items:
    """Columns of the items kept for one version (or a bin being filled)."""

    proxy: list[float] = field(default_factory=list)
    auditors: dict[str, list[float]] = field(default_factory=dict)
    length: list[int] = field(default_factory=list)
    at_cap: list[bool] = field(default_factory=list)
    signatures: list[int] = field(default_factory=list)
    source: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.proxy)

    def put(self, item: Audited, names: list[str], at: int | None = None) -> None:
        row = (item.proxy, item.length, item.at_cap, item.signatures, item.source)
        columns = (self.proxy, self.length, self.at_cap, self.signatures, self.source)
        for column, value in zip(columns, row, strict=True):
            if at is None:
                column.append(value)
            else:
                column[at] = value
        for name in names:
            column = self.auditors.setdefault(name, [])
            value = item.auditors.get(name, math.nan)
            if at is None:
                column.append(value)
            else:
                column[at] = value

    def extend(self, other: _Items, names: list[str]) -> None:
        self.proxy += other.proxy
        self.length += other.length
        self.at_cap += other.at_cap
        self.signatures += other.signatures
        self.source += other.source
        for name in names:
            self.auditors.setdefault(name, []).extend(other.auditors.get(name, [math.nan] * len(other)))

    def select(self, mask: np.ndarray) -> _Items:
        out = _Items()
        idx = np.flatnonzero(mask)
        out.proxy = [self.proxy[i] for i in idx]
        out.length = [self.length[i] for i in idx]
        out.at_cap = [self.at_cap[i] for i in idx]
        out.signatures = [self.signatures[i] for i in idx]
        out.source = [self.source[i] for i in idx]
        out.auditors = {name: [col[i] for i in idx] for name, col in self.auditors.items()}
        return out


@dataclass
class _Version:
    items: _Items = field(default_factory=_Items)
    recorded: int = 0  # items recorded (the reservoir keeps at most max_items_per_version)
    summary: dict[str, Any] | None = None  # cached; None when items changed since


@dataclass
class Baseline:
    """The first bin's means and standard deviations: the scale of the proxy–auditor gap."""

    proxy: tuple[float, float]
    auditors: dict[str, tuple[float, float]]


class Ledger:
    """One epoch's ledger: the versions of one run of the trainer's clock (a restart from a
    checkpoint that reuses version numbers starts another `Ledger`, never merging policies)."""

    def __init__(self, config: AuditConfig, epoch: int = 0) -> None:
        self.config = config
        self.epoch = epoch
        self.auditors = config.auditor_names()
        self.versions: dict[int, _Version] = {}
        self.summaries: dict[int, dict[str, Any]] = {}  # versions whose items were let go
        self.newest = -1
        self.binned_through = -1  # every version <= this one is in a closed bin
        self.late = 0
        self.bins: list[dict[str, Any]] = []  # closed bins' summaries, in order
        self.decisions: list[Decision] = []
        self.alarms: dict[str, dict[str, dict[str, Any]]] = {}
        """`alarms[alarm][subject]`: firing at the newest decision, the versions of the first
        firing bin, every bin it fired at, and the newest decision's evidence."""
        self.evaluator = Evaluator(self.auditors, list(SIGNATURES), config.alarms)
        self.baseline: Baseline | None = None
        self._open = _Items()  # the bin being filled
        self._open_versions: tuple[int, int] | None = None
        self._rng = random.Random(f"rewardplane-audit:{config.seed}")

    # ---------------------------------------------------------------- recording

    def record(self, items: list[Audited]) -> None:
        for item in items:
            if item.version <= self.binned_through:
                self.late += 1
            entry = self.versions.get(item.version)
            if entry is None:
                if item.version in self.summaries:  # its items were let go: counted, not kept
                    continue
                entry = self.versions[item.version] = _Version()
            entry.recorded += 1
            entry.summary = None
            cap = self.config.max_items_per_version
            if len(entry.items) < cap:
                entry.items.put(item, self.auditors)
            else:
                slot = self._rng.randrange(entry.recorded)
                if slot < cap:
                    entry.items.put(item, self.auditors, at=slot)
            self.newest = max(self.newest, item.version)

    # ---------------------------------------------------------------- bins and alarms

    def settle(self, *, ended: bool = False) -> list[Decision]:
        """Close the bins whose versions are all final; the decisions made at them. `ended`:
        the epoch is over (a restart began another), so every version it has is final."""
        final_through = self.newest if ended else self.newest - self.config.settle_versions
        made: list[Decision] = []
        for version in sorted(v for v in self.versions if self.binned_through < v <= final_through):
            entry = self.versions[version]
            self._open.extend(entry.items, self.auditors)
            low = self._open_versions[0] if self._open_versions else version
            self._open_versions = (low, version)
            self.binned_through = version
            if len(self._open) >= self.config.min_items:
                made += self._close_bin()
        self.binned_through = max(self.binned_through, final_through)
        self._forget_old()
        self.decisions += made
        for d in made:
            entry = self.alarms.setdefault(d.alarm, {}).setdefault(
                d.subject, {"firing": False, "first_fired_versions": None, "fired_bins": [], "last": None}
            )
            entry["firing"] = d.fired
            entry["last"] = {"bin": d.bin, "versions": list(d.versions), "fired": d.fired, **d.evidence}
            if d.fired:
                entry["fired_bins"].append(d.bin)
                if entry["first_fired_versions"] is None:
                    entry["first_fired_versions"] = list(d.versions)
        return made

    def _close_bin(self) -> list[Decision]:
        items, versions = self._open, self._open_versions
        assert versions is not None
        self._open, self._open_versions = _Items(), None
        proxy = np.asarray(items.proxy, dtype=np.float64)
        auditors = {a: np.asarray(items.auditors[a], dtype=np.float64) for a in self.auditors}
        if self.baseline is None:
            self.baseline = Baseline(_scale(proxy), {a: _scale(v) for a, v in auditors.items()})
            for entry in self.versions.values():  # their gaps are measured from this baseline
                entry.summary = None
        sig = np.asarray(items.signatures, dtype=np.int64)
        if versions[0] == versions[1]:  # a one-version bin: its summary is the version's, made once
            summary = dict(self.version_summary(versions[0]))
            summary.pop("recorded", None)
        else:
            summary = self._summary(items, versions)
        stats = BinStats(
            index=len(self.bins),
            versions=versions,
            n=len(items),
            proxy=Acc.of(proxy),
            auditors={a: Acc.of(v) for a, v in auditors.items()},
            taus={a: _estimate(summary["auditors"][a]["tau"]) for a in auditors},
            signatures={s: int(np.count_nonzero(sig >> bit & 1)) for bit, s in enumerate(SIGNATURES)},
            slopes={a: _estimate(summary["auditors"][a]["tilt"]) for a in auditors},
        )
        decisions = self.evaluator.add(stats)
        summary["bin"] = stats.index
        summary["alarms"] = {f"{d.alarm}:{d.subject}": {"fired": d.fired, **d.evidence} for d in decisions}
        self.bins.append(summary)
        return decisions

    def _forget_old(self) -> None:
        keep = self.config.keep_versions
        if len(self.versions) <= keep:
            return
        for version in sorted(self.versions)[: len(self.versions) - keep]:
            if version > self.binned_through:
                break
            self.summaries[version] = self.version_summary(version)
            del self.versions[version]

    # ---------------------------------------------------------------- summaries

    def version_summary(self, version: int) -> dict[str, Any]:
        entry = self.versions.get(version)
        if entry is None:
            return self.summaries[version]
        if entry.summary is None:
            entry.summary = self._summary(entry.items, (version, version))
            entry.summary["recorded"] = entry.recorded
        return entry.summary

    def _summary(self, items: _Items, versions: tuple[int, int]) -> dict[str, Any]:
        """Means with bootstrap intervals, τ, gap, length, signatures; and the same per source
        when the items carry more than one."""
        out = self._numbers(items)
        out["versions"] = list(versions)
        out["epoch"] = self.epoch
        sources = sorted(set(items.source))
        if len(sources) > 1 or (sources and sources[0] != NO_SOURCE):
            column = np.asarray(items.source, dtype=object)
            out["sources"] = {s or "(none)": self._numbers(items.select(column == s)) for s in sources}
        return out

    def _numbers(self, items: _Items) -> dict[str, Any]:
        proxy = np.asarray(items.proxy, dtype=np.float64)
        columns = {name: np.asarray(items.auditors.get(name, []), dtype=np.float64) for name in self.auditors}
        shared = self._shared_replicates(proxy, columns)
        proxy_means = shared["proxy"] if shared else self._replicates(proxy)
        out: dict[str, Any] = {
            "n": len(items),
            "proxy": interval(float(proxy.mean()) if proxy.size else None, proxy.size, proxy_means),
        }
        auditors: dict[str, Any] = {}
        for name, values in columns.items():
            ok = np.isfinite(values)
            means = shared[name] if shared else self._replicates(values)
            block = interval(float(values[ok].mean()) if ok.any() else None, int(ok.sum()), means)
            if shared:
                parts = tilt_products(proxy, values)
                tilt = None if parts is None else tilt_estimate(*parts, shared[f"tilt:{name}"])
            else:
                tilt = self._tilt(proxy[ok], values[ok]) if ok.any() else None
            block["tilt"] = None if tilt is None else _estimate_json(tilt)
            tau = _tau(proxy[ok], values[ok]) if ok.any() else None
            block["tau"] = None if tau is None else _estimate_json(tau)
            shared_draw = proxy_means if ok.all() else None  # one index draw for both: gap from replicates
            block["gap"] = self._gap(proxy[ok], values[ok], name, shared_draw, means)
            block["failed"] = int((~ok).sum())
            auditors[name] = block
        out["auditors"] = auditors
        lengths = np.asarray(items.length, dtype=np.float64)
        out["length"] = {
            "unit": self.config.length_unit,
            "mean": float(lengths.mean()) if lengths.size else None,
            "p50": float(np.percentile(lengths, 50)) if lengths.size else None,
            "p90": float(np.percentile(lengths, 90)) if lengths.size else None,
            "max": int(lengths.max()) if lengths.size else None,
            "at_cap": float(np.mean(items.at_cap)) if lengths.size else None,
        }
        sig = np.asarray(items.signatures, dtype=np.int64)
        out["signatures"] = {
            s: {
                "count": int(np.count_nonzero(sig >> bit & 1)),
                "rate": float(np.mean(sig >> bit & 1)) if sig.size else None,
            }
            for bit, s in enumerate(SIGNATURES)
        }
        return out

    def _replicates(self, values: np.ndarray) -> np.ndarray | None:
        return mean_replicates(values, seed=self.config.seed, replicates=self.config.replicates)

    def _tilt(self, proxy: np.ndarray, auditor: np.ndarray) -> Estimate | None:
        return tilt_slope(proxy, auditor, seed=self.config.seed, replicates=self.config.replicates)

    def _shared_replicates(self, proxy: np.ndarray, columns: dict[str, np.ndarray]) -> dict[str, Any] | None:
        """When no auditor failed on an item, every column resampled with one index draw: the
        proxy's, each auditor's and each tilt slope's products — the numbers the per-column
        bootstraps give (one seed, one n: the same draw), for a third of the draws. None
        otherwise (each column then draws over its own finite items)."""
        if proxy.size < 2 or any(v.size != proxy.size or not np.isfinite(v).all() for v in columns.values()):
            return None
        rows: dict[str, np.ndarray] = {"proxy": proxy, **columns}
        for name, values in columns.items():
            parts = tilt_products(proxy, values)
            if parts is not None:
                rows[f"tilt:{name}"] = parts[0]
        stacked = np.stack(list(rows.values()))
        means, _ = replicate_means(
            stacked, seed=self.config.seed, replicates=self.config.replicates, index_sha256=False
        )
        return dict(zip(rows, means, strict=True))

    def _gap(
        self,
        proxy: np.ndarray,
        auditor: np.ndarray,
        name: str,
        proxy_means: Any = None,
        auditor_means: Any = None,
    ) -> dict[str, Any] | None:
        """(proxy − first bin's proxy mean)/its sd − (auditor − its first-bin mean)/its sd, per
        item: how many baseline standard deviations the proxy has risen beyond the auditor. Its
        replicates are that combination of the proxy's and the auditor's when both were drawn
        with one index array (no auditor failures), else a bootstrap of their own."""
        if self.baseline is None or proxy.size == 0:
            return None
        (pm, ps), (am, as_) = self.baseline.proxy, self.baseline.auditors[name]
        if not (ps > 0 and as_ > 0):
            return None
        point = float((proxy.mean() - pm) / ps - (auditor.mean() - am) / as_)
        if proxy_means is not None and auditor_means is not None:
            means = (proxy_means - pm) / ps - (auditor_means - am) / as_
        else:
            per_item = (proxy - pm) / ps - (auditor - am) / as_
            means = self._replicates(per_item)
        block = interval(point, proxy.size, means)
        return {"mean": block["mean"], "ci_95": block["ci_95"]}

    def recorded(self, version: int) -> int:
        """Items recorded for `version` (0 when none)."""
        entry = self.versions.get(version)
        if entry is not None:
            return entry.recorded
        return self.summaries[version]["recorded"] if version in self.summaries else 0

    def snapshot_versions(self, since: int | None = None) -> list[dict[str, Any]]:
        versions = sorted({*self.versions, *self.summaries})
        if since is not None:
            versions = [v for v in versions if v >= since]
        return [{"version": v, **self.version_summary(v)} for v in versions]


def _scale(values: np.ndarray) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    if values.size < 2:
        return (float(values.mean()) if values.size else 0.0), 0.0
    return float(values.mean()), float(values.std(ddof=1))


def _tau(x: np.ndarray, y: np.ndarray) -> Any:
    ok = np.isfinite(x) & np.isfinite(y)
    return kendall_tau(x[ok], y[ok])


def _estimate_json(estimate: Estimate) -> dict[str, Any]:
    low, high = estimate.interval()
    return {
        "point": estimate.point,
        "ci_95": [low, high],
        "se": estimate.se if math.isfinite(estimate.se) else None,
        "n": estimate.n,
    }


def _estimate(block: dict[str, Any] | None) -> Estimate | None:
    """An estimate back from its JSON block (a missing se: no usable interval)."""
    if block is None:
        return None
    return Estimate(block["point"], math.inf if block["se"] is None else block["se"], block["n"])
