"""Versions and group ids are untrusted input, attacked through a real server (issue 45): a timestamp
version never blinds the audit, a Unicode digit never drops a request, a lagging async worker
is not `late` at the defaults, a restart that reuses versions starts a new epoch, and a client
cannot choose a group id that is never audited."""

from __future__ import annotations

import hashlib
import time

import httpx

from support.serve import LiveServer, make_config

SCORERS = [
    {"name": "len", "kind": "length"},
    {"name": "words", "kind": "length", "options": {"unit": "words"}},
]
AUDIT = {"proxy": "len", "auditors": ["words"], "sample": 1.0, "min_items": 10, "batch_wait_s": 0}


def items(version, n: int = 20, group: str | None = None) -> list[dict]:
    out = [{"id": str(i), "prompt": "p", "response": "word " * (i % 5 + 1), "metadata": {"policy_version": version}}
           for i in range(n)]  # fmt: skip
    if group is not None:
        for item in out:
            item["group_id"] = group
    return out


def post(url: str, batch: list[dict]) -> None:
    r = httpx.post(f"{url}/v1/score", json={"scorers": ["len"], "items": batch}, timeout=30)
    assert r.status_code == 200, r.text


def settled(url: str, audited: int) -> dict:
    deadline = time.monotonic() + 120
    while True:
        body = httpx.get(f"{url}/v1/audit").json()
        if body["counts"]["audited"] >= audited and body["queue_depth"] == 0:
            return body
        assert time.monotonic() < deadline, body["counts"]
        time.sleep(0.05)


def test_a_timestamp_version_is_refused_for_its_item_and_never_moves_the_clock():
    with LiveServer(make_config(SCORERS, audit={**AUDIT, "settle_versions": 1})) as live:
        for v in range(3):
            post(live.url, items(v))
        stamp = {**items(10**12)[0], "id": "stamp"}  # a worker sending a timestamp
        post(live.url, items(3)[:5] + [stamp] + items(3)[5:])
        for v in range(4, 7):
            post(live.url, items(v))
        body = settled(live.url, 140)
    counts = body["counts"]
    assert counts["bad_version"] == 1 and counts["late"] == 0 and counts["audited"] == 140
    assert body["newest_version"] == 6 and [b["versions"] for b in body["bins"]][-1] == [5, 5]


def test_a_unicode_digit_version_fails_its_item_alone():
    with LiveServer(make_config(SCORERS, audit=AUDIT)) as live:
        batch = items(0, 8)
        batch[3]["metadata"]["policy_version"] = "²"  # str.isdigit() says yes, int() says no
        for k, bad in ((5, "٣"), (6, "0x1f")):  # an Arabic-Indic three, hex
            batch.append({**batch[k], "id": f"bad{k}", "metadata": {"policy_version": bad}})
        post(live.url, batch)
        body = settled(live.url, 7)
    assert body["counts"]["bad_version"] == 3 and body["counts"]["audited"] == 7  # the 7 valid ones


def test_a_worker_lagging_one_to_four_versions_is_not_late_at_the_defaults():
    with LiveServer(make_config(SCORERS, audit=AUDIT)) as live:
        for v in range(24):
            post(live.url, items(v, 10))  # the fresh worker
            if v >= 4:
                post(live.url, items(v - 1 - v % 4, 10))  # the lagging one: 1-4 versions behind
        body = settled(live.url, 440)
    counts = body["counts"]
    assert counts["late"] <= 0.02 * counts["audited"], counts
    assert body["binned_through"] >= 15 and "sufficient" in body["evidence"]


def test_a_restart_that_reuses_versions_starts_a_new_epoch():
    config = make_config(SCORERS, audit={**AUDIT, "settle_versions": 1, "restart_gap_s": 0.5})
    with LiveServer(config) as live:
        for v in range(6):
            post(live.url, items(v))
        time.sleep(0.8)  # the trainer restarts from its checkpoint at version 3
        for v in range(3, 7):
            post(live.url, items(v))
        body = settled(live.url, 200)
        metrics = httpx.get(f"{live.url}/metrics").text
    assert body["epoch"] == 1 and [e["versions"] for e in body["epochs"]] == [[0, 5], [3, 6]]
    assert body["counts"]["late"] == 0
    # version 3 of each epoch is its own: 20 items each, never merged
    threes = [(v["epoch"], v["recorded"]) for v in body["versions"] if v["version"] == 3]
    assert threes == [(0, 20), (1, 20)]
    assert [(b["epoch"], b["versions"]) for b in body["bins"]][-3:] == [(1, [3, 3]), (1, [4, 4]), (1, [5, 5])]
    assert "rewardplane_audit_epoch 1.0" in metrics
    # the report shows them: each epoch its own curve, the headline names the restart
    from rewardplane.eval.report.audit import _epochs, _headline, audit_png

    assert [len(part) for part in _epochs(body["bins"])] == [6, 3] and "2 epochs (restarts)" in _headline(
        body
    )
    assert audit_png(body).startswith(b"\x89PNG")


def _old_public_hash_skips(group: str, sample: float) -> bool:
    """What the sampler was before issue 45: a hash of seed 0 and the id alone."""
    digest = hashlib.blake2b(f"0:{group}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >= sample * 2**64


def test_a_chosen_group_id_cannot_avoid_the_audit():
    sample = 0.2
    chosen = next(f"g{i}" for i in range(1000) if _old_public_hash_skips(f"g{i}", sample))
    config = make_config(SCORERS, audit={**AUDIT, "sample": sample, "settle_versions": 1})
    with LiveServer(config) as live, LiveServer(config) as twin:
        for v in range(40):
            for url in (live.url, twin.url):
                post(url, items(v, 8, group=chosen))  # the same id at every version
        body, other = settled(live.url, 8), settled(twin.url, 8)
    audited = [v["version"] for v in body["versions"]]
    # sampled afresh at each version (P(never in 40) = 0.8^40 ≈ 1e-4), whole groups only
    assert 0 < len(audited) < 40 and all(v["recorded"] == 8 for v in body["versions"])
    assert body["counts"]["sampled"] == 8 * len(audited)
    # keyed by a secret of each server: two servers audit different versions of the same id
    assert audited != [v["version"] for v in other["versions"]]
    assert "secret" not in str(body["settings"]).lower()


def test_too_few_audited_items_a_version_is_said_in_words():
    config = make_config(SCORERS, audit={**AUDIT, "min_items": 100, "settle_versions": 1})
    with LiveServer(config) as live:
        assert "unknown: no final version yet" in httpx.get(f"{live.url}/v1/audit").json()["evidence"]
        for v in range(6):
            post(live.url, items(v, 5))  # 5 audited a version: a bin would span 20 versions
        body = settled(live.url, 30)
    assert body["evidence"].startswith("insufficient: 5.0 audited items a version, needs 13")
    assert body["bins"] == []
