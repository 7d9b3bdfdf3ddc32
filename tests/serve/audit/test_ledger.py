"""The ledger: versions become final in order, merge into bins of `min_items`, late items are
counted but never change a decision, memory stays bounded, and sources are broken out."""

from __future__ import annotations

import math

import pytest

from rewardplane.serve.audit.config import AuditConfig
from rewardplane.serve.audit.ledger import Audited, Ledger


def ledger(**settings) -> Ledger:
    return Ledger(
        AuditConfig(
            proxy="rm", auditors=["gold"], sample=1.0, **{"min_items": 10, "settle_versions": 1, **settings}
        )
    )


def items(
    version: int, n: int, *, source: str = "", start: float = 0.0, gold: float | None = None
) -> list[Audited]:
    return [
        Audited(version, source, start + i, {"gold": start + i if gold is None else gold}, i + 1, False, 0)
        for i in range(n)
    ]


def test_versions_merge_into_bins_of_min_items_once_final():
    book = ledger(min_items=10, settle_versions=1)
    book.record(items(0, 4) + items(1, 4))
    assert book.settle() == [] and book.bins == []  # version 1 is not final, version 0 is too small
    book.record(items(2, 12))
    book.settle()
    assert book.bins == [] and book.binned_through == 1  # 0-1 final, but 8 items are not a bin
    book.record(items(3, 1))
    book.settle()
    assert [b["versions"] for b in book.bins] == [[0, 2]]
    assert book.bins[0]["n"] == 20 and book.binned_through == 2


def test_a_late_item_counts_in_its_version_but_never_in_a_closed_bin():
    book = ledger(min_items=5, settle_versions=1)
    book.record(items(0, 5) + items(1, 5))
    book.settle()
    closed = dict(book.bins[0])
    book.record(items(0, 3, start=100))
    book.settle()
    assert book.late == 3 and book.bins[0] == closed
    assert book.version_summary(0)["n"] == 8 and book.version_summary(0)["recorded"] == 8


def test_items_per_version_and_kept_versions_are_bounded():
    book = ledger(min_items=16, max_items_per_version=16, keep_versions=4)
    for v in range(10):
        book.record(items(v, 50))
        book.settle()
    assert len(book.versions) <= 4 and set(book.aged) == {0, 1, 2, 3, 4, 5}
    assert all(len(e.items) == 16 for e in book.versions.values())
    assert book.version_summary(2)["recorded"] == 50 and book.version_summary(2)["n"] == 16
    book.record(items(1, 5))  # a version whose items were let go: counted as late, not kept
    assert book.late == 5 and 1 not in book.versions


def test_bin_summary_has_intervals_tau_gap_length_and_sources():
    book = ledger(min_items=20)
    book.record(items(0, 20, source="math") + items(0, 20, source="code", start=5))
    book.record(items(1, 1))
    book.settle()
    summary = book.bins[0]
    assert summary["n"] == 40 and set(summary["sources"]) == {"math", "code"}
    gold = summary["auditors"]["gold"]
    assert gold["tau"]["point"] == pytest.approx(1.0) and gold["failed"] == 0
    low, high = gold["ci_95"]
    assert low < gold["mean"] < high
    assert gold["gap"]["mean"] == pytest.approx(0.0, abs=1e-9)  # the first bin is the baseline
    assert summary["length"]["max"] == 20 and summary["length"]["unit"] == "words"
    assert summary["alarms"] == {}  # no rule has a full window yet


def test_an_auditor_failure_is_a_missing_value_never_a_number():
    book = ledger(min_items=5)
    rows = items(0, 6)
    rows[0] = Audited(0, "", 1.0, {"gold": math.nan}, 1, False, 0)
    book.record(rows + items(1, 1))
    book.settle()
    assert book.bins[0]["auditors"]["gold"]["failed"] == 1
    assert book.bins[0]["auditors"]["gold"]["n"] == 5


def test_intervals_are_computed_when_read_and_equal_an_eager_summary():
    book = ledger(min_items=20, keep_versions=4)
    for v in range(12):
        book.record(items(v, 12, source="math" if v % 2 else "code", start=v))
        book.settle()
    # at the close, only what the alarms and gauges read: the bins' columns wait for a read
    assert book.closed and all(b.items is not None for b in book.closed)
    assert all(book.aged[v].summary is None and book.aged[v].items is not None for v in book.aged)
    head = book.bin_summary(0, intervals=False)
    assert "sources" not in head and head["auditors"]["gold"]["tilt"] is not None
    bins = book.bins  # read: computed now, cached, columns let go
    assert all(b.items is None for b in book.closed) and book.bins == bins
    eager = book._summary(_columns_of(book, bins[0]["versions"]), tuple(bins[0]["versions"]))
    assert {k: v for k, v in bins[0].items() if k not in ("bin", "alarms")} == eager
    assert set(bins[0]["sources"]) == {"math", "code"}
    aged = book.version_summary(min(book.aged))
    assert aged["recorded"] == 12 and aged["auditors"]["gold"]["ci_95"] is not None
    assert book.aged[min(book.aged)].items is None and book._held_bytes > 0
    book.snapshot_versions()  # every version read: nothing is held any more
    assert book._held_bytes == 0 and not book._held


def _columns_of(book: Ledger, versions: list[int]):
    """The items of those versions again, in the ledger's column form (for an eager summary)."""
    from rewardplane.serve.audit.ledger import _Items

    merged = _Items()
    for v in range(versions[0], versions[1] + 1):
        for row in items(v, 12, source="math" if v % 2 else "code", start=v):
            merged.put(row, book.auditors)
    return merged


def test_columns_held_for_a_read_are_capped(monkeypatch):
    import rewardplane.serve.audit.ledger as module

    monkeypatch.setattr(module, "HELD_BYTES", 4096)
    book = ledger(min_items=20, keep_versions=4)
    for v in range(40):
        book.record(items(v, 25))
        book.settle()
        assert book._held_bytes <= 4096
    # the oldest were summarised as the cap was reached, the same numbers a read gives
    assert book.closed[0].items is None and book.bins[0]["auditors"]["gold"]["ci_95"] is not None
    assert book.version_summary(0)["recorded"] == 25
