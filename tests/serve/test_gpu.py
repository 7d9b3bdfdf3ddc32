"""CUDA path of the CLIP scorer: on-device JPEG decode + preprocessing agree with the CPU path."""

from __future__ import annotations

import math

import pytest

from rewardplane.serve.protocol import ItemError, ScoreItem
from rewardplane.serve.scorers.registry import ScorerSpec, build_scorer
from support.serve import jpeg_bytes


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
    items = [ScoreItem(str(k), "a cat", "", jpeg_bytes((256, 256), (60 * k, 90, 160))) for k in range(4)]
    out = scorer.score_batch(items)
    # NaN and inf are floats too: the half-precision overflow this test is about would pass a type check
    assert all(isinstance(v, float) and math.isfinite(v) for v in out), out
    fp32 = build_scorer(ScorerSpec(name="c", kind="clip", shape="clip-vit-l-14", device="cuda"))
    fp32.load()
    reference = fp32.score_batch(items)
    for k, (half, full) in enumerate(zip(out, reference, strict=True)):
        # half precision rounds: close to fp32 (an overflow or garbage is far off), not equal
        assert abs(half - full) <= 0.1 * max(1.0, abs(full)), (dtype, k, half, full)


@pytest.mark.gpu
def test_cuda_host_decode_option_uses_pillow_and_scores_like_nvjpeg():
    pytest.importorskip("torchvision")
    items = [
        ScoreItem(str(k), "a cat", "", jpeg_bytes((80 + 8 * k, 64), (40 * k, 90, 160))) for k in range(4)
    ]
    spec = {"name": "c", "kind": "clip", "shape": "tiny-clip", "device": "cuda"}
    device, host = (
        build_scorer(ScorerSpec(**spec)),
        build_scorer(ScorerSpec(**spec, options={"decode": "host"})),
    )
    device.load()
    host.load()
    assert device.info().extra["decode_on_device"] is True
    assert host.info().extra["decode_on_device"] is False
    for a, b in zip(device.score_batch(items), host.score_batch(items), strict=True):
        assert abs(a - b) <= 1e-2 * max(1.0, abs(a)), (a, b)  # nvJPEG vs libjpeg rounding


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "dtype"), [("tiny-clip", "fp32"), ("clip-vit-l-14", "bf16")])
def test_cuda_graph_replays_score_like_eager_at_every_batch_size(shape, dtype):
    """Buckets of max_batch_size 16: 1 and 16 exact, 3 and 9 padded, 40 three replays (chunks)."""
    items = [
        ScoreItem(
            str(k),
            f"prompt number {k % 7}" + " and more" * (k % 3),
            "",
            jpeg_bytes((72 + 4 * k, 64), (5 * k, 90, 160)),
        )
        for k in range(40)
    ]
    spec = {
        "name": "c",
        "kind": "clip",
        "shape": shape,
        "device": "cuda",
        "dtype": dtype,
        "max_batch_size": 16,
    }
    eager = build_scorer(ScorerSpec(**spec))
    graphed = build_scorer(ScorerSpec(**spec, options={"cuda_graphs": True}))
    eager.load()
    graphed.load()
    assert graphed.info().extra["cuda_graph_sizes"] == [1, 2, 4, 8, 16]
    assert graphed.info().identity != eager.info().identity
    for n in (1, 3, 9, 16, 40):
        a, b = eager.score_batch(items[:n]), graphed.score_batch(items[:n])
        assert all(isinstance(v, float) for v in a + b), (a, b)
        if dtype == "fp32":
            assert all(abs(x - y) <= 1e-5 * max(1.0, abs(x)) for x, y in zip(a, b, strict=True)), (n, a, b)
        else:
            diff = sum((x - y) ** 2 for x, y in zip(a, b, strict=True)) ** 0.5
            assert diff <= 2e-2 * sum(x * x for x in a) ** 0.5, (n, a, b)
    # A padded replay must not depend on what the padding rows hold: bucket 4 with three real
    # rows, then full with other items (its last row now holds item 13), then three rows again.
    first = graphed.score_batch(items[:3])
    graphed.score_batch(items[10:14])
    assert graphed.score_batch(items[:3]) == first
