"""The result channel on its own: the zygote keeps only the program's nonce-prefixed lines and
frames them with the run's secret; the server accepts only a report framed with that secret."""

from __future__ import annotations

import json

from rewardplane.serve.execution.channel import MAX_RECORD_BYTES, Records, read_report


def test_records_keep_nonce_lines_and_the_report_is_framed_with_the_secret():
    rec = Records(b"N")
    for chunk in (b'N {"i": 0, "v": 1}\n{"i": 1, "v": 2}\nX {"i"', b': 1}\nN {"i": 1, "v": 3}\nN {"i": 2'):
        rec.feed(chunk)
    rec.finish()
    data = rec.report(b"S3CR3T", {"isolation": "test", "exit": 7, "signal": None})
    meta, records = read_report(data, b"S3CR3T")
    assert records == [{"i": 0, "v": 1}, {"i": 1, "v": 3}]  # a line cut short does not parse: dropped
    assert meta == {"isolation": "test", "exit": 7, "signal": None, "forged": 2, "truncated": False}
    assert read_report(data, b"OTHER") is None


def test_records_past_the_cap_are_dropped_and_said_so():
    rec = Records(b"N")
    rec.feed(b"N " + b"x" * (MAX_RECORD_BYTES + 10))  # one endless line
    rec.feed(b'\nN {"i": 0, "v": 1}\n')
    rec.finish()
    meta, records = read_report(rec.report(b"S", {}), b"S")
    assert meta["truncated"] and records == [{"i": 0, "v": 1}]


def test_a_report_without_the_secret_is_no_report():
    forged = b"\n" + json.dumps({"exit": 0}).encode() + b'\n{"i": 0, "v": 1}'
    assert read_report(forged, b"S") is None
    assert read_report(b"", b"S") is None
    assert read_report(b"S\nnot json\n", b"S") is None
    meta, records = read_report(b'S\n{"exit": 0}\n{"i": 0}\n[1]\nnope\n' + b"[" * 100000, b"S")
    assert meta == {"exit": 0} and records == [{"i": 0}]
