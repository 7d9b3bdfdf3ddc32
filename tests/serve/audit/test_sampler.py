"""The sampler's per-request path decides exactly what the per-item path decides (groups whole,
ungrouped items by geometric skips, versions clocked in order), and ungrouped items are sampled
at the configured rate."""

from __future__ import annotations

import random

from rewardplane.serve.audit.config import AuditConfig
from rewardplane.serve.audit.sampler import Sampler
from rewardplane.serve.scorers.base import ScoreItem

SECRET = b"s" * 32
FIXED = {"factor": 1}  # no boost: these tests read the configured rate


def request(rng: random.Random, step: int, n: int = 64) -> list[ScoreItem]:
    """Mostly one version and groups of 8, sometimes a mix: two versions, ungrouped items, a
    missing version, a malformed one."""
    mixed = rng.random() < 0.5
    items = []
    for i in range(n):
        raw = step if not mixed else rng.choice([step, str(step + 1), None, "²", step])
        group = f"{step}-{i // 8}" if not mixed or rng.random() < 0.7 else None
        metadata = None if mixed and rng.random() < 0.1 else {"policy_version": raw}
        items.append(ScoreItem(str(i), "p", "r", group_id=group, metadata=metadata))
    return items


def test_the_per_request_path_takes_what_the_per_item_path_takes():
    config = AuditConfig(proxy="rm", auditors=["gold"], sample=0.2, boost=FIXED)
    fast, each = Sampler(config, SECRET), Sampler(config, SECRET)
    rng = random.Random(0)
    taken = 0
    for step in range(300):
        items = request(rng, step)
        values = [rng.random() for _ in items]
        counts_fast: dict[str, int] = {}
        counts_each: dict[str, int] = {}
        got = fast.take(items, values, counts_fast)
        want = each._take_each(items, values, counts_each)
        assert [(i.id, e, v, x) for i, e, v, x in got] == [(i.id, e, v, x) for i, e, v, x in want]
        assert counts_fast == counts_each
        taken += len(got)
    assert 0.15 < taken / (300 * 64) < 0.25


def test_a_group_is_sampled_when_its_keyed_digest_is_below_the_rate():
    """The definition, written out: a group is sampled at a version when its keyed digest, read
    as a big-endian integer, is below rate × 2⁶⁴ (the sampler compares bytes against the bound's
    ceiling) — at every rate, and with the bound set amid the groups' digests."""
    groups = [f"g{i}" for i in range(3000)]

    def digests(sampler: Sampler, version: int) -> dict[str, int]:
        keyed, _ = sampler._version_key(version)
        out = {}
        for g in groups:
            h = keyed.copy()
            h.update(g.encode())
            out[g] = int.from_bytes(h.digest(), "big")
        return out

    for sample in (0.001, 0.03, 0.5, 1.0):
        sampler = Sampler(AuditConfig(proxy="rm", auditors=["gold"], sample=sample, boost=FIXED), SECRET)
        for version in (0, 7):
            want = {g for g, d in digests(sampler, version).items() if d < sample * 2**64}
            assert sampler._sampled_groups(version, groups) == want
            assert {g for g in groups if sampler.sampled(version, g)} == want
            assert len(want) > 0 or sample < 0.01
    sampler = Sampler(AuditConfig(proxy="rm", auditors=["gold"], sample=0.5, boost=FIXED), SECRET)
    by_group = digests(sampler, 3)
    bound = float(sorted(by_group.values())[1500])  # rounded to a float: the groups near it straddle it
    sampler._versions[(0, 3)] = (sampler._version_key(3)[0], bound)
    assert sampler._sampled_groups(3, groups) == {g for g, d in by_group.items() if d < bound}


def test_groups_are_whole_and_ungrouped_items_sampled_at_the_rate():
    config = AuditConfig(proxy="rm", auditors=["gold"], sample=0.03, boost=FIXED)
    sampler = Sampler(config, SECRET)
    ungrouped = grouped = 0
    for step in range(400):
        items = [ScoreItem(str(i), "p", "r", metadata={"policy_version": step}) for i in range(50)]
        ungrouped += len(sampler.take(items, [1.0] * 50, {}))
        items = [ScoreItem(str(i), "p", "r", group_id=f"g{i // 8}", metadata={"policy_version": step})
                 for i in range(64)]  # fmt: skip
        got = sampler.take(items, [1.0] * 64, {})
        assert len(got) % 8 == 0
        grouped += len(got)
    assert 0.022 < ungrouped / 20_000 < 0.038  # 600 expected, sd ~24
    assert 0.015 < grouped / 25_600 < 0.05  # 3,200 groups of 8


def test_a_secret_decides_and_another_decides_otherwise():
    config = AuditConfig(proxy="rm", auditors=["gold"], sample=0.5, boost=FIXED)
    items = [ScoreItem(str(i), "p", "r", group_id=f"g{i}", metadata={"policy_version": 1}) for i in range(64)]
    ids = [
        [i.id for i, *_ in Sampler(config, s).take(items, [1.0] * 64, {})]
        for s in (SECRET, SECRET, b"t" * 32)
    ]
    assert ids[0] == ids[1] and ids[0] != ids[2]


def test_a_version_keeps_the_rate_it_was_first_seen_at_so_its_groups_stay_whole():
    """The boost raises the rate mid-run: a version already seen keeps its rate (a group split
    across requests is never half audited), a new one takes the new rate, and what a higher
    rate samples includes what the lower one did (the same keyed hash, a higher threshold)."""
    config = AuditConfig(proxy="rm", auditors=["gold"], sample=0.1, boost={"factor": 4})
    sampler = Sampler(config, SECRET)
    assert sampler.rate == sampler.boosted == 0.4  # an epoch starts boosted

    def half(version: int, part: int) -> list[ScoreItem]:
        return [ScoreItem(f"{part}-{i}", "p", "r", group_id=f"g{i}", metadata={"policy_version": version})
                for i in range(400)]  # fmt: skip

    first = {i.group_id for i, *_ in sampler.take(half(0, 0), [1.0] * 400, {})}
    sampler.rate = 0.1  # calm: the stream lowers the rate while version 0 is still arriving
    second = {i.group_id for i, *_ in sampler.take(half(0, 1), [1.0] * 400, {})}
    assert first == second and 100 < len(first) < 220  # version 0 stays at 0.4, its groups whole
    low = {i.group_id for i, *_ in sampler.take(half(1, 0), [1.0] * 400, {})}
    assert 15 < len(low) < 70  # version 1 at 0.1
    sampler.rate = 0.4
    assert {i.group_id for i, *_ in sampler.take(half(1, 1), [1.0] * 400, {})} == low
    high = {i.group_id for i, *_ in sampler.take(half(2, 0), [1.0] * 400, {})}
    again = Sampler(config, SECRET)
    again.rate = 0.1
    assert {i.group_id for i, *_ in again.take(half(2, 0), [1.0] * 400, {})} <= high
