"""The result channel on its own: the unit keeps only the program's nonce-prefixed lines and frames
them with the run's secret; the server accepts only a report framed with that secret."""

from __future__ import annotations

import json
import os

from rewardplane.serve.execution.channel import read_report, relay


def test_relay_keeps_nonce_lines_and_frames_them_with_the_secret():
    rec_r, rec_w = os.pipe()
    res_r, res_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the program's process
        os.write(rec_w, b'N {"i": 0, "v": 1}\n{"i": 1, "v": 2}\nX {"i": 1}\nN {"i": 1, "v": 3}\nN {"i": 2')
        os._exit(7)
    os.close(rec_w)
    code = relay(b"S3CR3T", b"N", rec_r, pid, res_w, {"isolation": "test"})
    data = os.read(res_r, 1 << 16)
    assert code == 7
    meta, records = read_report(data, b"S3CR3T")
    assert records == [{"i": 0, "v": 1}, {"i": 1, "v": 3}]  # a line cut short does not parse: dropped
    assert meta == {"isolation": "test", "exit": 7, "signal": None, "forged": 2, "truncated": False}
    assert read_report(data, b"OTHER") is None


def test_a_report_without_the_secret_is_no_report():
    forged = b"\n" + json.dumps({"exit": 0}).encode() + b'\n{"i": 0, "v": 1}'
    assert read_report(forged, b"S") is None
    assert read_report(b"", b"S") is None
    assert read_report(b"S\nnot json\n", b"S") is None
    meta, records = read_report(b'S\n{"exit": 0}\n{"i": 0}\n[1]\nnope\n' + b"[" * 100000, b"S")
    assert meta == {"exit": 0} and records == [{"i": 0}]
