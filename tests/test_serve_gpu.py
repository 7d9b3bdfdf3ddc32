"""CUDA path of the CLIP scorer: on-device JPEG decode + preprocessing agree with the CPU path."""

from __future__ import annotations

import pytest

from rewardkit.serve.config import ScorerSpec, build_scorer
from rewardkit.serve.scorers.base import ItemError, ScoreItem
from serve_support import jpeg_bytes


@pytest.mark.gpu
def test_cuda_clip_matches_cpu_and_reports_device_decode():
    import torch

    items = [
        ScoreItem(str(k), f"prompt {k % 2}", "", jpeg_bytes((64 + 8 * k, 48), (30 * k, 100, 200 - 20 * k)))
        for k in range(5)
    ]
    items.append(ScoreItem("bad", "x", "", b"\xff\xd8garbage\xff\xd9"))
    cpu = build_scorer(ScorerSpec(name="c", kind="clip", shape="tiny-clip", device="cpu"))
    cpu.load()
    gpu = build_scorer(ScorerSpec(name="c", kind="clip", shape="tiny-clip", device="cuda"))
    gpu.load()
    # A shape's random init comes from the CPU RNG: the same seed is the same model on every device.
    for (name, a), b in zip(gpu.model.state_dict().items(), cpu.model.state_dict().values(), strict=True):
        assert a.device.type == "cuda" and torch.equal(a.cpu(), b), name
    pytest.importorskip("torchvision")
    assert gpu.info().extra["decode_on_device"] is True
    on_cpu, on_gpu = cpu.score_batch(items), gpu.score_batch(items)
    assert all(isinstance(s, float) for s in on_cpu[:-1] + on_gpu[:-1]), (on_cpu, on_gpu)
    # The images differ in colour, so equal-looking scores would mean the comparison is vacuous.
    assert max(on_cpu[:-1]) - min(on_cpu[:-1]) > 1e-3, on_cpu
    for k, (c, g) in enumerate(zip(on_cpu[:-1], on_gpu[:-1], strict=True)):
        # nvJPEG and libjpeg may round a few pixels differently: close, not bit-equal.
        assert abs(c - g) <= 1e-2 * max(1.0, abs(c)), (k, c, g)
    assert isinstance(on_cpu[-1], ItemError) and on_cpu[-1].code == "bad_image"
    assert isinstance(on_gpu[-1], ItemError) and on_gpu[-1].code == "bad_image"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_cuda_half_precision_scores_are_finite(dtype):
    scorer = build_scorer(
        ScorerSpec(name="c", kind="clip", shape="clip-vit-l-14", device="cuda", dtype=dtype)
    )
    scorer.load()
    out = scorer.score_batch([ScoreItem(str(k), "a cat", "", jpeg_bytes((256, 256))) for k in range(4)])
    assert all(isinstance(v, float) for v in out)
