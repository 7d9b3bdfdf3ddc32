"""Which of the proxy's scored items the audit takes, and under which (epoch, version): the only
part of the audit on the request path (docs/audit.md).

Its cost is per request and per (version, group), not per item: a request's items are read in
C-level passes (their raw versions, group ids and values), each distinct raw version is parsed
and clocked once, each distinct (version, group) decided by one keyed hash, and an item is
touched one by one only when its group was sampled. An unsampled item costs a counter at most.
Items without a group are sampled by geometric skips (the gap to the next sampled one, drawn
once per sampled item), the same independent `sample`-chance per item as one draw each.
Anything unusual in a request (a float or non-finite score, a bool or float version, a version
by arrival order) takes the per-item path, which decides the same way item by item.

Versions are untrusted input: only a non-negative integer (or a string of ASCII digits) no more
than `max_version_jump` ahead of the newest is taken, per item; a version below the newest
after `restart_gap_s` of silence starts a new epoch (a restart).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import operator
import random
import time
from typing import Any

from rewardplane.serve.audit.config import AuditConfig
from rewardplane.serve.scorers.base import ScoreItem

log = logging.getLogger(__name__)

Taken = tuple[ScoreItem, int, int, float]
"""A sampled item: (item, epoch, version, proxy score)."""

_VERSION_LIMIT = 10**18
_UNSEEN = object()
_FAST_RAWS = frozenset({int, str, type(None)})
_METADATA = operator.attrgetter("metadata")
_GROUP = operator.attrgetter("group_id")


class Sampler:
    def __init__(self, config: AuditConfig, secret: bytes) -> None:
        """`secret` keys the sampling: never exposed, so which groups are audited cannot be known
        or chosen by a client."""
        self.config = config
        self.boosted = min(1.0, config.sample * config.boost.factor)
        self.rate = self.boosted
        """The share sampled now: `boosted` while the stream's boost watches (as every epoch
        starts), else `sample` (set from the ledger's thread; one float). A version keeps the
        rate in force when it was first seen, so its groups stay whole when the rate changes."""
        self._versions: dict[tuple[int, int], tuple[Any, float]] = {}  # `_version_key`'s
        self._keyed = hashlib.blake2b(digest_size=8, key=secret)  # copied per decision: the key once
        self._rng = random.Random(secret)
        self._skip = self._gap()  # ungrouped items to pass over before the next sampled one
        self.epoch = 0
        self._newest: int | None = None  # the newest version taken in this epoch
        self._heard = -math.inf  # monotonic time of the newest versioned item
        self._arrivals = 0

    def take(self, items: list[ScoreItem], values: list[Any], counts: dict[str, int]) -> list[Taken]:
        """The sampled items of one request (`values`: the proxy's results); outcomes other
        than `sampled` (`unversioned`, `bad_version`) are added to `counts`."""
        raws = _raw_versions(items, self.config.by)
        kinds = set(map(type, raws))
        usable = set(map(type, values)) == {float} and math.isfinite(sum(values))
        if usable and kinds <= _FAST_RAWS and not (type(None) in kinds and self.config.arrival_window):
            return self._take_request(items, values, raws, kinds, counts)
        return self._take_each(items, values, counts)

    def _take_request(
        self,
        items: list[ScoreItem],
        values: list[float],
        raws: list[Any],
        kinds: set[type],
        counts: dict[str, int],
    ) -> list[Taken]:
        """Every value a finite float, every raw version an int, a str or missing: one decision
        per (version, group), in the order they first appear."""
        now = time.monotonic()
        groups = list(map(_GROUP, items))
        if len(kinds) == 1 and raws.count(raws[0]) == len(raws):  # one version (the usual request)
            keys: Any = dict.fromkeys(groups)
            raw = raws[0]
            clocked = {raw: None if raw is None else self._clock(as_version(raw), now)}
            version = clocked[raw]
            if version is None:
                outcome = "unversioned" if raw is None else "bad_version"
                counts[outcome] = counts.get(outcome, 0) + len(raws)
                return []
            hits = self._sampled_groups(version, [g for g in keys if g is not None])
            picked = self._skips([i for i, g in enumerate(groups) if g is None]) if None in keys else []
            if hits:
                picked += [i for i, g in enumerate(groups) if g in hits]
            return [(items[i], self.epoch, version, values[i]) for i in sorted(picked)] if picked else []
        keys = list(zip(raws, groups, strict=True))
        clocked = {}
        hits_by_key: set[tuple[Any, Any]] = set()
        valid: set[Any] = set()
        for raw in dict.fromkeys(raws):
            clocked[raw] = None if raw is None else self._clock(as_version(raw), now)
            if clocked[raw] is None:
                outcome = "unversioned" if raw is None else "bad_version"
                counts[outcome] = counts.get(outcome, 0) + raws.count(raw)
            else:
                valid.add(raw)
        for raw, group in dict.fromkeys(keys):
            if group is not None and raw in valid and self.sampled(clocked[raw], group):  # type: ignore[arg-type]
                hits_by_key.add((raw, group))
        ungrouped = [i for i, (raw, group) in enumerate(keys) if group is None and raw in valid]
        picked = self._skips(ungrouped) if ungrouped else []
        if hits_by_key:
            picked += [i for i, key in enumerate(keys) if key in hits_by_key]
        return [(items[i], self.epoch, clocked[raws[i]], values[i]) for i in sorted(picked)]  # type: ignore[misc]

    def _skips(self, positions: list[int]) -> list[int]:
        """Which of the ungrouped items at `positions` (their indices, in order) are sampled."""
        picked = []
        at = self._skip
        while at < len(positions):
            picked.append(positions[at])
            at += 1 + self._gap()
        self._skip = at - len(positions)
        return picked

    def _gap(self) -> int:
        """Items passed over before the next sampled one: Geometric(sample) on {0, 1, ...}."""
        p = self.rate
        if p >= 1.0:
            return 0
        return int(math.log(1.0 - self._rng.random()) / math.log(1.0 - p))

    def _take_each(self, items: list[ScoreItem], values: list[Any], counts: dict[str, int]) -> list[Taken]:
        """Item by item: any value (errors and non-finite scores are skipped), any raw version
        (a bad one is refused for its item alone), versions by arrival order."""
        cfg = self.config
        now = time.monotonic()
        taken: list[Taken] = []
        decided: dict[tuple[int, str], bool] = {}
        clocked: dict[Any, int | None] = {}
        for item, value in zip(items, values, strict=False):
            if not isinstance(value, float) or not math.isfinite(value):
                continue
            raw = item.metadata.get(cfg.by) if item.metadata else None
            if raw is None:
                if cfg.arrival_window is None:
                    counts["unversioned"] = counts.get("unversioned", 0) + 1
                    continue
                version: int | None = self._arrivals // cfg.arrival_window
                self._arrivals += 1
            else:
                cacheable = raw.__class__ is int or raw.__class__ is str
                version = clocked.get(raw, _UNSEEN) if cacheable else _UNSEEN  # type: ignore[assignment]
                if version is _UNSEEN:
                    version = self._clock(as_version(raw), now)
                    if cacheable:
                        clocked[raw] = version
            if version is None:
                counts["bad_version"] = counts.get("bad_version", 0) + 1
                continue
            group = item.group_id
            if group is None:
                if self._skip > 0:
                    self._skip -= 1
                    continue
                self._skip = self._gap()
            else:
                hit = decided.get((version, group))
                if hit is None:
                    hit = decided[(version, group)] = self.sampled(version, group)
                if not hit:
                    continue
            taken.append((item, self.epoch, version, value))
        return taken

    def _clock(self, version: int | None, now: float) -> int | None:
        """The version an item is recorded under, or None when it is refused: malformed, or more
        than `max_version_jump` ahead of the newest (it never moves the clock). A version below
        the newest after `restart_gap_s` without a versioned item starts a new epoch."""
        if version is None:
            return None
        newest = self._newest
        if newest is not None and version > newest + self.config.max_version_jump:
            return None
        if newest is None or version > newest:
            self._newest = version
        elif version < newest and now - self._heard >= self.config.restart_gap_s:
            self.epoch += 1
            self._newest = version
            self.rate = self.boosted  # a new epoch starts watching (stream._adapt)
            log.warning(
                "audit: version %d after %d and a pause: a restart, epoch %d", version, newest, self.epoch
            )
        self._heard = now
        return version

    def sampled(self, version: int, group: str) -> bool:
        """A GRPO group is sampled whole, by a hash keyed with this server's secret over the
        version and the group id: unknowable to a client, and afresh at every version."""
        return bool(self._sampled_groups(version, [group]))

    def _sampled_groups(self, version: int, groups: list[str]) -> set[str]:
        """Which of `groups` are sampled at `version`: each group's keyed digest, read as a
        big-endian integer, below `rate_of(version)` × 2⁶⁴. The version's key and bound are read
        once, and the digest compared as bytes (big-endian bytes of one length order as their
        integers do, and an integer is below a float bound exactly when it is below its ceiling)."""
        keyed, below = self._version_key(version)
        if below >= 2**64:
            return set(groups)
        bound = math.ceil(below).to_bytes(8, "big")
        hits = set()
        for group in groups:
            h = keyed.copy()
            h.update(group.encode())
            if h.digest() < bound:
                hits.add(group)
        return hits

    def rate_of(self, version: int) -> float:
        """The rate `version` (of this epoch) is sampled at: the one in force when it was first
        seen (the newest 256 versions are remembered; an older one takes today's rate)."""
        return self._version_key(version)[1] / 2**64

    def _version_key(self, version: int) -> tuple[Any, float]:
        """The keyed hash already fed `version` (a group's decision adds only its id) and the
        bound below which a group is sampled: `rate_of(version)` × 2⁶⁴, fixed when first seen."""
        key = (self.epoch, version)
        known = self._versions.get(key)
        if known is None:
            keyed = self._keyed.copy()
            keyed.update(f"{version}:".encode())
            known = self._versions[key] = (keyed, self.rate * 2**64)
            if len(self._versions) > 256:
                del self._versions[min(self._versions)]
        return known


def _raw_versions(items: list[ScoreItem], by: str) -> list[Any]:
    """Each item's raw version (`metadata[by]`, None where missing): in one C-level pass when
    every item has a metadata dict, item by item otherwise."""
    metadata = list(map(_METADATA, items))
    try:
        return list(map(dict.get, metadata, itertools.repeat(by)))
    except TypeError:  # an item without metadata (None)
        return [m.get(by) if m else None for m in metadata]


def as_version(raw: Any) -> int | None:
    """A non-negative integer, an integral float, or a string of 1-18 ASCII digits; else None
    (`"²".isdigit()` is True, and `int("²")` raises: only ASCII digits are read)."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw if 0 <= raw < _VERSION_LIMIT else None
    if isinstance(raw, float):
        return int(raw) if raw.is_integer() and 0 <= raw < _VERSION_LIMIT else None
    if isinstance(raw, str):
        text = raw.strip()
        if 0 < len(text) <= 18 and text.isascii() and text.isdigit():
            return int(text)
    return None
