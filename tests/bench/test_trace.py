"""Trace summaries on a hand-built trace whose busy, idle and overlap times are known."""

from __future__ import annotations

import gzip
import json

import pytest

from rewardplane.bench.trace import main, summarize_trace


def _kernel(name, ts, dur, stream, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


EVENTS = [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 2000},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1, "dur": 4},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 6, "dur": 6},
    {"ph": "i", "cat": "marker", "name": "instant", "ts": 3},  # not a complete event: ignored
    _kernel("sm90_xmma_gemm_bf16", 0, 100, 7),
    _kernel("flash_fwd_kernel", 200, 100, 7),
    _kernel("sm90_xmma_gemm_bf16", 50, 100, 8),  # overlaps stream 7 by 50 us
    _kernel("Memcpy HtoD", 1700, 50, 7, cat="gpu_memcpy"),
]


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": EVENTS}, f)
    return path


def test_busy_idle_overlap_and_gaps_are_the_union_arithmetic(trace):
    s = summarize_trace(trace)
    g = s["gpu"]
    assert s["window_ms"] == pytest.approx(2.0)
    assert g["kernels"] == 3
    # union: [0,150] + [200,300] + [1700,1750] = 300 us
    assert g["busy_ms"] == pytest.approx(0.300)
    assert g["busy_fraction"] == pytest.approx(0.15)
    assert g["idle_ms"] == pytest.approx(1.7)
    assert g["concurrent_ms"] == pytest.approx(0.050)
    assert g["streams"] == {
        "7": {"busy_ms": pytest.approx(0.25), "events": 3},
        "8": {"busy_ms": pytest.approx(0.1), "events": 1},
    }
    assert g["time_by_kind_ms"] == {
        "attention": pytest.approx(0.1), "gemm": pytest.approx(0.2), "gpu_memcpy": pytest.approx(0.05)
    }  # fmt: skip
    assert g["gaps"]["count"] == 2 and g["gaps"]["over_1ms"] == 1 and g["gaps"]["over_100us"] == 1
    assert g["gaps"]["max_ms"] == pytest.approx(1.4)
    assert g["gaps"]["idle_in_gaps_over_1ms_ms"] == pytest.approx(1.4)
    top = g["top_kernels"][0]
    assert (
        top["name"] == "sm90_xmma_gemm_bf16"
        and top["count"] == 2
        and top["share"] == pytest.approx(0.2 / 0.35)
    )
    assert s["host"] == {"kernel_launches": 2, "launch_ms": pytest.approx(0.010)}


def test_plain_json_traces_and_the_cli(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": EVENTS}))
    png = tmp_path / "split.png"
    assert main([str(path), "--plot", str(png)]) == 0
    assert json.loads(capsys.readouterr().out)[0]["gpu"]["kernels"] == 3
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main([]) == 2


def test_a_trace_without_complete_events_is_an_error(tmp_path):
    path = tmp_path / "empty.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "i", "ts": 0}]}))
    with pytest.raises(ValueError, match="no complete"):
        summarize_trace(path)
