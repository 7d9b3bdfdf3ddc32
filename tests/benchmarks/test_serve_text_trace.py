"""benchmarks/serve_text_trace.py records every packed forward a scorer runs and sums the GPU
timeline right; on CPU its CUDA events are stood in by a host-clock event (the H200 run is the
only place it meets real ones)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

from rewardplane.models import packed_scoring
from support.seqcls import seqcls

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import serve_text_trace


class HostEvent:
    """torch.cuda.Event's interface on the host clock: done as soon as recorded."""

    def __init__(self, enable_timing: bool = False):
        self.at = None

    def record(self):
        self.at = time.perf_counter()

    def query(self) -> bool:
        return self.at is not None

    def synchronize(self):
        pass

    def elapsed_time(self, other: HostEvent) -> float:
        return 1e3 * (other.at - self.at)


def test_every_packed_forward_of_a_scoring_call_is_recorded_with_its_tokens(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", HostEvent)
    for name in ("plan_packed", "packed_scores"):  # restored after the test
        monkeypatch.setattr(packed_scoring, name, getattr(packed_scoring, name))
    records = serve_text_trace.install(str(tmp_path / "trace"))
    model = seqcls("llama", "rk_varlen")
    seqs = [[1 + (i * j) % 50 for j in range(10 + i)] for i in range(12)]
    start = time.perf_counter()
    with torch.no_grad():
        scores, stats = packed_scoring.score_sequences(
            seqs, varlen=True, max_batch_tokens=64, backbone=model.base_model, head=model.score
        )
        packed_scoring.score_sequences(  # one more forward: a record is kept once found done
            seqs[:1], varlen=True, max_batch_tokens=64, backbone=model.base_model, head=model.score
        )
    end = time.perf_counter()
    forwards = packed_scoring.budget_chunks([len(s) for s in seqs], 64)
    assert len(records) == len(forwards) + 1 and len(forwards) > 2
    records = records[:-1]
    assert sum(r["tokens"] for r in records) == stats["computed"]
    assert [r["items"] for r in records] == [len(f) for f in forwards]
    for r in records:
        assert start <= r["plan_start"] <= r["launch_start"] <= r["launch_end"] <= end
        assert r["gpu_start"] <= r["gpu_end"] <= end
    summary = serve_text_trace.summarise(records, start, end)
    assert summary["forwards"] == len(records)
    assert 0 < summary["gpu_busy"] <= 1 + 1e-9
    assert summary["tokens_per_forward"] == pytest.approx(stats["computed"] / len(records))


def test_summary_reads_idle_gaps_and_late_launches_from_the_timeline():
    def forward(start, end, launched):
        return {"gpu_start": start, "gpu_end": end, "launch_end": launched, "launch_start": start - 0.01,
                "plan_start": start - 0.02, "tokens": 1000, "items": 2}  # fmt: skip

    rows = [forward(0.0, 0.1, -0.05), forward(0.15, 0.25, 0.2), forward(0.25, 0.35, 0.1)]
    summary = serve_text_trace.summarise(rows, -1.0, 1.0)
    assert summary["gpu_busy"] == pytest.approx(0.3 / 0.35)
    assert summary["mean_gap_ms"] == pytest.approx(25.0) and summary["max_gap_ms"] == pytest.approx(50.0)
    assert summary["launch_late_ms"] == pytest.approx(50.0 / 3)
    assert summary["gpu_tokens_per_s"] == pytest.approx(3000 / 0.3)
    assert serve_text_trace.summarise(rows, 0.1, 1.0)["forwards"] == 2  # the window cuts the first
