"""CUDA path of the CLIP scorer: on-device JPEG decode + preprocessing agree with the CPU path."""

from __future__ import annotations

import pytest

from rewardkit.serve.config import ScorerSpec, build_scorer
from rewardkit.serve.scorers.base import ItemError, ScoreItem
from serve_support import jpeg_bytes


@pytest.mark.gpu
def test_cuda_clip_matches_cpu_and_reports_device_decode():
    items = [
        ScoreItem(str(k), f"prompt {k % 2}", "", jpeg_bytes((64 + 8 * k, 48), (30 * k, 100, 200 - 20 * k)))
        for k in range(5)
    ]
    items.append(ScoreItem("bad", "x", "", b"\xff\xd8garbage\xff\xd9"))
    scores = {}
    for device in ("cpu", "cuda"):
        scorer = build_scorer(ScorerSpec(name="c", kind="clip", shape="tiny-clip", device=device))
        scorer.load()
        scores[device] = scorer.score_batch(items)
        if device == "cuda":
            pytest.importorskip("torchvision")
            assert scorer.info().extra["decode_on_device"] is True
    for cpu, gpu in zip(scores["cpu"][:-1], scores["cuda"][:-1], strict=True):
        # nvJPEG and libjpeg may round a few pixels differently: close, not bit-equal.
        assert abs(cpu - gpu) <= 1e-2 * max(1.0, abs(cpu))
    assert isinstance(scores["cuda"][-1], ItemError) and scores["cuda"][-1].code == "bad_image"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_cuda_half_precision_scores_are_finite(dtype):
    scorer = build_scorer(
        ScorerSpec(name="c", kind="clip", shape="clip-vit-l-14", device="cuda", dtype=dtype)
    )
    scorer.load()
    out = scorer.score_batch([ScoreItem(str(k), "a cat", "", jpeg_bytes((256, 256))) for k in range(4)])
    assert all(isinstance(v, float) for v in out)
