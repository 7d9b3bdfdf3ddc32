"""Audited items by policy version, closed into bins, with their summaries (docs/audit.md).

`Ledger.record` takes audited items (any version, any order); `Ledger.settle` closes every
bin whose versions are final and returns the alarm decisions made there. A version is final
once an item `settle_versions` newer has been recorded; final versions are taken in version
order and merged into bins of at least `min_items` items, so each bin is one stretch of a
policy that barely changed. An item for a version that was already binned is still counted in
that version's statistics (`late`), never in a closed bin: each decision is made once.

Memory is bounded: at most `max_items_per_version` items per version (a uniform reservoir),
raw items only for the newest `keep_versions` versions, and a bin keeps sufficient statistics
and its intervals, not its items (their columns only until the intervals are first read).

Summaries are computed once, and their bootstrap intervals only when read. What the alarms need
at a bin's close (means, the tilt slope with its standard error, τ, signature counts) is
computed then; the means' and the gap's intervals, and the per-source breakdown, when
`GET /v1/audit`, `audit.json` or the report first reads the bin (then cached). A version
that ages out past `keep_versions` keeps its columns as arrays until its summary is first read.
Columns held for a later read are capped at `HELD_BYTES` a ledger: past it, the oldest are
summarised at once and let go, so nothing unread grows without bound.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
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
HELD_BYTES = 16 * 1024 * 1024
"""Bytes of item columns a ledger holds for summaries not read yet (aged-out versions', closed
bins'); past it the oldest are computed and their columns let go."""


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

    def frozen(self) -> _Items:
        """The same columns as arrays (a fraction of the lists' memory), for a summary read later."""
        out = _Items()
        out.proxy = np.asarray(self.proxy, dtype=np.float64)
        out.length = np.asarray(self.length, dtype=np.int64)
        out.at_cap = np.asarray(self.at_cap, dtype=bool)
        out.signatures = np.asarray(self.signatures, dtype=np.int64)
        out.source = tuple(self.source)
        out.auditors = {name: np.asarray(col, dtype=np.float64) for name, col in self.auditors.items()}
        return out  # type: ignore[return-value]

    def nbytes(self) -> int:
        return 64 * (6 + len(self.auditors)) + len(self) * (8 * (3 + len(self.auditors)) + 9)

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
    items: _Items | None = field(default_factory=_Items)  # None: let go once summarised (aged out)
    recorded: int = 0  # items recorded (the reservoir keeps at most max_items_per_version)
    summary: dict[str, Any] | None = None  # cached; None when items changed since


@dataclass
class _Bin:
    summary: dict[str, Any]
    """What the alarms and gauges read, made at the close; the intervals are added when read."""
    items: _Items | None
    """The bin's columns until its intervals are computed (then None)."""


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
        self.aged: dict[int, _Version] = {}
        """Versions past `keep_versions`: no more items are kept; their summary is made when read."""
        self.newest = -1
        self.binned_through = -1  # every version <= this one is in a closed bin
        self.late = 0
        self.closed: list[_Bin] = []  # closed bins, in order (`bins`: their summaries, complete)
        self._held: OrderedDict[tuple[str, int], int] = OrderedDict()  # columns kept for a read: bytes
        self._held_bytes = 0
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
                if item.version in self.aged:  # its items were let go: counted, not kept
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
            for entry in (*self.versions.values(), *self.aged.values()):  # gaps are from this baseline
                if entry.items is not None:
                    entry.summary = None
        sig = np.asarray(items.signatures, dtype=np.int64)
        summary = self._head(items, versions)  # the intervals: when the bin is first read
        stats = BinStats(
            index=len(self.closed),
            versions=versions,
            n=len(items),
            proxy=Acc.of(proxy),
            auditors={a: Acc.of(v) for a, v in auditors.items()},
            taus={a: _estimate(summary["auditors"][a]["tau"]) for a in auditors},
            signatures={s: int(np.count_nonzero(sig >> bit & 1)) for bit, s in enumerate(SIGNATURES)},
            slopes={a: _estimate(summary["auditors"][a]["tilt"]) for a in auditors},
            scores={a: (proxy, v) for a, v in auditors.items()},
        )
        decisions = self.evaluator.add(stats)
        summary["bin"] = stats.index
        summary["alarms"] = {f"{d.alarm}:{d.subject}": {"fired": d.fired, **d.evidence} for d in decisions}
        held = items.frozen()
        self.closed.append(_Bin(summary, held))
        self._hold(("bin", stats.index), held)
        return decisions

    def _forget_old(self) -> None:
        keep = self.config.keep_versions
        if len(self.versions) <= keep:
            return
        for version in sorted(self.versions)[: len(self.versions) - keep]:
            if version > self.binned_through:
                break
            entry = self.aged[version] = self.versions.pop(version)
            if entry.summary is None:  # its columns wait for a read (or the byte cap)
                assert entry.items is not None
                entry.items = entry.items.frozen()
                self._hold(("version", version), entry.items)
            else:
                entry.items = None

    def _hold(self, key: tuple[str, int], items: _Items) -> None:
        """Keep `items` for a summary read later; past `HELD_BYTES`, summarise the oldest now."""
        size = items.nbytes()
        self._held[key] = size
        self._held_bytes += size
        while self._held_bytes > HELD_BYTES and self._held:
            oldest = next(iter(self._held))
            (self.bin_summary if oldest[0] == "bin" else self.version_summary)(oldest[1])
            self._release(oldest)

    def _release(self, key: tuple[str, int]) -> None:
        self._held_bytes -= self._held.pop(key, 0)

    # ---------------------------------------------------------------- summaries

    @property
    def bins(self) -> list[dict[str, Any]]:
        """Every closed bin's summary, intervals included (computed now where not read yet)."""
        return [self.bin_summary(i) for i in range(len(self.closed))]

    def bin_summary(self, index: int, *, intervals: bool = True) -> dict[str, Any]:
        """Closed bin `index`'s summary; `intervals=False`: as made at its close (the means,
        tilt, τ and counts the alarms and gauges read), without computing its intervals."""
        entry = self.closed[index]
        if intervals and entry.items is not None:
            self._complete(entry.summary, entry.items)
            entry.items = None
            self._release(("bin", index))
        return entry.summary

    def version_summary(self, version: int) -> dict[str, Any]:
        entry = self.versions.get(version) or self.aged[version]
        if entry.summary is None:
            assert entry.items is not None
            entry.summary = self._summary(entry.items, (version, version))
            entry.summary["recorded"] = entry.recorded
            if version in self.aged:  # no item is added to it any more: the summary is final
                entry.items = None
                self._release(("version", version))
        return entry.summary

    def _summary(self, items: _Items, versions: tuple[int, int]) -> dict[str, Any]:
        """Means with bootstrap intervals, tilt, τ, gap, length, signatures; and the same per
        source when the items carry more than one."""
        out = self._head(items, versions)
        self._complete(out, items)
        return out

    def _head(self, items: _Items, versions: tuple[int, int]) -> dict[str, Any]:
        out = self._numbers(items)
        out["versions"] = list(versions)
        out["epoch"] = self.epoch
        return out

    def _complete(self, out: dict[str, Any], items: _Items) -> None:
        """Add to a head (`_head`) its means' and gaps' intervals and the per-source numbers."""
        self._intervals(out, items)
        sources = sorted(set(items.source))
        if len(sources) > 1 or (sources and sources[0] != NO_SOURCE):
            column = np.asarray(items.source, dtype=object)
            out["sources"] = {}
            for s in sources:
                part = items.select(column == s)
                out["sources"][s or "(none)"] = numbers = self._numbers(part)
                self._intervals(numbers, part)

    def _columns(self, items: _Items) -> tuple[np.ndarray, dict[str, np.ndarray], bool]:
        """The proxy's and each auditor's columns, and whether one index draw serves them all
        (no auditor failed on an item): the per-column bootstraps' numbers (one seed, one n: the
        same draw) for a fraction of the draws."""
        proxy = np.asarray(items.proxy, dtype=np.float64)
        columns = {name: np.asarray(items.auditors.get(name, []), dtype=np.float64) for name in self.auditors}
        shared = proxy.size >= 2 and all(
            v.size == proxy.size and np.isfinite(v).all() for v in columns.values()
        )
        return proxy, columns, shared

    def _numbers(self, items: _Items) -> dict[str, Any]:
        """Everything but the means' and gaps' intervals (placeholders until `_intervals`)."""
        proxy, columns, shared = self._columns(items)
        tilts = self._shared_tilts(proxy, columns) if shared else {}
        out: dict[str, Any] = {
            "n": len(items),
            "proxy": interval(float(proxy.mean()) if proxy.size else None, proxy.size, None),
        }
        auditors: dict[str, Any] = {}
        for name, values in columns.items():
            ok = np.isfinite(values)
            block = interval(float(values[ok].mean()) if ok.any() else None, int(ok.sum()), None)
            if shared:
                tilt = tilts.get(name)
            else:
                tilt = self._tilt(proxy[ok], values[ok]) if ok.any() else None
            block["tilt"] = None if tilt is None else _estimate_json(tilt)
            tau = _tau(proxy[ok], values[ok]) if ok.any() else None
            block["tau"] = None if tau is None else _estimate_json(tau)
            block["gap"] = self._gap(proxy[ok], values[ok], name)
            block["failed"] = int((~ok).sum())
            auditors[name] = block
        out["auditors"] = auditors
        lengths = np.asarray(items.length, dtype=np.float64)
        p50, p90 = (float(p) for p in np.percentile(lengths, [50, 90])) if lengths.size else (None, None)
        out["length"] = {
            "unit": self.config.length_unit,
            "mean": float(lengths.mean()) if lengths.size else None,
            "p50": p50,
            "p90": p90,
            "max": int(lengths.max()) if lengths.size else None,
            "at_cap": float(np.mean(items.at_cap)) if lengths.size else None,
        }
        sig = np.asarray(items.signatures, dtype=np.int64)
        hits = np.count_nonzero(sig[:, None] >> np.arange(len(SIGNATURES)) & 1, axis=0)  # one pass, every bit
        out["signatures"] = {
            s: {"count": int(hits[bit]), "rate": float(hits[bit] / sig.size) if sig.size else None}
            for bit, s in enumerate(SIGNATURES)
        }
        return out

    def _intervals(self, out: dict[str, Any], items: _Items) -> None:
        """The percentile bootstrap intervals of the proxy's and each auditor's mean and of each
        gap, into `out` (made by `_numbers` over the same items)."""
        proxy, columns, shared = self._columns(items)
        if shared:  # one index draw for every column: the gap is read off the proxy's and auditor's
            means, _ = replicate_means(
                np.stack([proxy, *columns.values()]),
                seed=self.config.seed,
                replicates=self.config.replicates,
                index_sha256=False,
            )
            drawn = dict(zip(["\0proxy", *columns], means, strict=True))
            proxy_means = drawn["\0proxy"]
        else:
            proxy_means = self._replicates(proxy)
        out["proxy"] = interval(out["proxy"]["mean"], out["proxy"]["n"], proxy_means)
        for name, values in columns.items():
            block = out["auditors"][name]
            ok = np.isfinite(values)
            means = drawn[name] if shared else self._replicates(values)
            block.update(interval(block["mean"], block["n"], means))
            if block["gap"] is not None:
                both = (proxy_means, means) if ok.all() else (None, None)
                block["gap"] = self._gap(proxy[ok], values[ok], name, *both, with_interval=True)

    def _replicates(self, values: np.ndarray) -> np.ndarray | None:
        return mean_replicates(values, seed=self.config.seed, replicates=self.config.replicates)

    def _tilt(self, proxy: np.ndarray, auditor: np.ndarray) -> Estimate | None:
        return tilt_slope(proxy, auditor, seed=self.config.seed, replicates=self.config.replicates)

    def _shared_tilts(self, proxy: np.ndarray, columns: dict[str, np.ndarray]) -> dict[str, Estimate]:
        """Each auditor's tilt slope, its products resampled with the index draw every column of
        these items shares (`_intervals` draws the same indices for the means)."""
        parts = {
            name: p for name, values in columns.items() if (p := tilt_products(proxy, values)) is not None
        }
        if not parts:
            return {}
        means, _ = replicate_means(
            np.stack([products for products, _ in parts.values()]),
            seed=self.config.seed,
            replicates=self.config.replicates,
            index_sha256=False,
        )
        return {name: tilt_estimate(*p, m) for (name, p), m in zip(parts.items(), means, strict=True)}

    def _gap(
        self,
        proxy: np.ndarray,
        auditor: np.ndarray,
        name: str,
        proxy_means: Any = None,
        auditor_means: Any = None,
        *,
        with_interval: bool = False,
    ) -> dict[str, Any] | None:
        """(proxy − first bin's proxy mean)/its sd − (auditor − its first-bin mean)/its sd, per
        item: how many baseline standard deviations the proxy has risen beyond the auditor. Its
        replicates (`with_interval`) are that combination of the proxy's and the auditor's when
        both were drawn with one index array (no auditor failures), else a bootstrap of their own."""
        if self.baseline is None or proxy.size == 0:
            return None
        (pm, ps), (am, as_) = self.baseline.proxy, self.baseline.auditors[name]
        if not (ps > 0 and as_ > 0):
            return None
        point = float((proxy.mean() - pm) / ps - (auditor.mean() - am) / as_)
        if not with_interval:
            means = None
        elif proxy_means is not None and auditor_means is not None:
            means = (proxy_means - pm) / ps - (auditor_means - am) / as_
        else:
            per_item = (proxy - pm) / ps - (auditor - am) / as_
            means = self._replicates(per_item)
        block = interval(point, proxy.size, means)
        return {"mean": block["mean"], "ci_95": block["ci_95"]}

    def recorded(self, version: int) -> int:
        """Items recorded for `version` (0 when none)."""
        entry = self.versions.get(version) or self.aged.get(version)
        return entry.recorded if entry is not None else 0

    def snapshot_versions(self, since: int | None = None) -> list[dict[str, Any]]:
        versions = sorted({*self.versions, *self.aged})
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
