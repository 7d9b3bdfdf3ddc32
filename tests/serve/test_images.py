"""Hostile images are judged per item at admission (issue 23, contract lines 2-3).

The corpus is `support.hostile.hostile_images()`: truncated JPEG/PNG at several cut points,
decompression bombs, 1x4000 / 4000x1 and 21:1 images, CMYK, 16-bit, palette, RGBA, animated
GIF/PNG, WebP. A refused image is its item's `bad_input`; the rest of the request and other
requests score; readiness holds; every case answers within 2 s; the server's peak memory grows
by at most 300 MB over the whole corpus (measured on the real `rewardplane serve` process).
"""

from __future__ import annotations

import base64
import concurrent.futures
import math
import time

import httpx
import pytest

from rewardplane.serve.images import ImageDecoder, ImageRejected, decode_rgb, inspect_image
from rewardplane.serve.prefetch import SharedDecoder
from rewardplane.serve.protocol import ItemError, ScoreItem
from rewardplane.serve.scorers.registry import ScorerSpec, build_scorer
from support.hostile import hostile_images, jpeg_bomb, noise, peak_rss, png_bomb, served, server_process
from support.serve import jpeg_bytes

CORPUS = hostile_images()
TIME_BOUND_S = 2.0
MEMORY_BOUND = 300 * 1024 * 1024


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize(("name", "data", "want"), CORPUS, ids=[c[0] for c in CORPUS])
def test_decode_rgb_refuses_or_decodes_each_case(name, data, want):
    if want == "bad_input":
        with pytest.raises(ImageRejected):
            decode_rgb(data)
    else:
        pixels = decode_rgb(data)
        assert pixels.dtype.__str__() == "torch.uint8" and pixels.shape[0] == 3


@pytest.mark.parametrize(
    ("mode", "kw"),
    [
        ("RGB", {"subsampling": 0}),
        ("RGB", {"subsampling": 1}),
        ("RGB", {"subsampling": 2}),
        ("RGB", {"progressive": True}),
        ("L", {}),
        ("CMYK", {}),
    ],
)
def test_strict_jpeg_decode_gives_pillows_pixels(mode, kw):
    """The strict libjpeg-turbo decode replaced Pillow's for JPEGs: same pixels, bit for bit
    (CMYK keeps Pillow's conversion after the strict check)."""
    import io

    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    noise((67, 45), 21, mode).save(buf, format="JPEG", quality=88, **kw)
    data = buf.getvalue()
    with Image.open(io.BytesIO(data)) as img:
        want = np.asarray(img.convert("RGB"))
    got = decode_rgb(data).permute(1, 2, 0).numpy()
    assert got.shape == want.shape and (got == want).all()


def test_the_device_decode_path_checks_jpegs_strictly_before_nvjpeg():
    """nvJPEG fills a cut stream with grey like libjpeg does: the strict CPU check runs first, so
    a JPEG cut short with its end marker put back never reaches the GPU decoder."""
    import torch

    class FakeNvjpeg:  # stands in for torchvision.io on a GPU: decodes anything it is given
        ImageReadMode = type("M", (), {"RGB": "RGB"})
        seen: list[int] = []

        def decode_jpeg(self, tensors, mode, device):
            items = tensors if isinstance(tensors, list) else [tensors]
            self.seen.extend(len(t) for t in items)
            out = [torch.zeros(3, 8, 8, dtype=torch.uint8) for _ in items]
            return out if isinstance(tensors, list) else out[0]

    import io

    buf = io.BytesIO()
    noise((320, 240), 1).save(buf, format="JPEG", quality=90)
    good = buf.getvalue()
    cut = good[: len(good) // 2] + b"\xff\xd9"
    inspect_image(cut)  # the header check passes it: only the strict decode can tell
    decoder = ImageDecoder("cpu", threads=1)
    decoder._tvio = FakeNvjpeg()
    good_out, cut_out = decoder.decode([good, cut])
    assert isinstance(good_out, torch.Tensor)
    assert isinstance(cut_out, ImageRejected) and "corrupt JPEG" in str(cut_out)
    assert decoder._tvio.seen == [len(good)]


def test_bombs_are_refused_from_the_header_without_decoding(monkeypatch):
    from PIL import ImageFile

    def no_decoding(self):  # any decode would call ImageFile.load
        raise AssertionError("decoded a bomb")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
    for data in (png_bomb(), jpeg_bomb(), png_bomb(5000, 5000)):
        with pytest.raises(ImageRejected, match="pixels"):
            inspect_image(data)
        out = ImageDecoder("cpu", threads=1).decode([data])
        assert isinstance(out[0], ImageRejected)


def test_sixteen_bit_greyscale_keeps_its_levels():
    import io

    import numpy as np
    from PIL import Image

    arr = np.full((8, 8), 32768, dtype=np.uint16)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    pixels = decode_rgb(buf.getvalue())
    assert int(pixels.min()) == int(pixels.max()) == 128  # not clipped to white


def test_clip_prepare_fails_each_hostile_item_alone_and_prefetch_reads_it():
    scorer = build_scorer(ScorerSpec(name="c", kind="clip", shape="tiny-clip", device="cpu"))
    scorer.limit_image_pixels(4096 * 4096)
    scorer.load()
    items = [ScoreItem(str(k), "a cat", "", data) for k, (_, data, _) in enumerate(CORPUS)]
    for item, (name, _, want) in zip(items, CORPUS, strict=True):
        got = scorer.prepare(item)
        if want == "bad_input":
            assert isinstance(got, ItemError) and got.code == "bad_input", name
        else:
            assert got is item, name
    # with a shared decoder holding the request's images, prepare reads them instead of decoding
    shared = SharedDecoder(scorer.decoder)
    scorer.decoder = shared
    good = [i for i, c in zip(items, CORPUS, strict=True) if c[2] == "score"]
    import asyncio

    held = shared.hold([i.image for i in good])
    asyncio.run(shared.ready(held))
    decoded_before = shared.decoded
    assert all(scorer.prepare(i) is i for i in good)
    assert shared.decoded == decoded_before and shared.hits == len(good)
    results = scorer.score_batch(good)
    assert all(isinstance(r, float) and math.isfinite(r) for r in results)
    shared.release(held)
    shared.close()


def test_max_image_aspect_option():
    import io

    buf = io.BytesIO()
    noise((300, 10)).save(buf, format="PNG")
    strict = build_scorer(ScorerSpec(name="c", kind="clip", shape="tiny-clip", device="cpu"))
    loose = build_scorer(
        ScorerSpec(name="c", kind="clip", shape="tiny-clip", device="cpu", options={"max_image_aspect": 40})
    )
    for s in (strict, loose):
        s.load()
    item = ScoreItem("a", "x", "", buf.getvalue())
    assert isinstance(strict.prepare(item), ItemError)
    assert loose.prepare(item) is item
    from rewardplane.core.errors import ConfigError

    with pytest.raises(ConfigError, match="max_image_aspect"):
        build_scorer(ScorerSpec(name="c", kind="clip", shape="tiny-clip", options={"max_image_aspect": 0}))


SERVICE_YAML = """
limits: {max_body_bytes: 33554432, max_items: 64}
scorers:
  - {name: clip, kind: clip, shape: tiny-clip, device: cpu, max_batch_size: 16, max_wait_ms: 2}
  - {name: len, kind: length}
"""


def test_hostile_images_through_a_real_server(tmp_path):
    """Each hostile image alone, beside good items, and while other clients score: the hostile
    item is `bad_input`, its neighbours score, readiness holds, < 2 s, < 300 MB peak growth."""
    good = jpeg_bytes((64, 48))
    with served(tmp_path, SERVICE_YAML) as url, httpx.Client(base_url=url, timeout=30) as client:
        proc = server_process(url)

        def score(items, scorers=("clip", "len")):
            body = {"scorers": list(scorers), "items": items}
            return client.post("/v1/score", json=body)

        warm = score([{"id": "w", "prompt": "a cat", "image": {"b64": b64(good)}}])
        assert warm.status_code == 200, warm.text
        baseline = proc.memory_info().rss
        stop = False
        others: list[int] = []

        def other_client():  # another client scoring good images the whole time
            with httpx.Client(base_url=url, timeout=30) as c:
                while not stop:
                    body = {
                        "scorers": ["clip"],
                        "items": [{"id": "o", "prompt": "a dog", "image": {"b64": b64(good)}}],
                    }
                    r = c.post("/v1/score", json=body)
                    others.append(r.status_code if r.status_code != 200 else
                                  (200 if isinstance(r.json()["results"][0]["scores"].get("clip"), float) else -1))  # fmt: skip

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            bg = pool.submit(other_client)
            timings = {}
            for name, data, want in CORPUS:
                items = [
                    {"id": "before", "prompt": "a cat", "image": {"b64": b64(good)}},
                    {"id": "hostile", "prompt": "a cat", "response": "r", "image": {"b64": b64(data)}},
                    {"id": "after", "prompt": "a cat", "image": {"b64": b64(good)}},
                ]
                started = time.perf_counter()
                r = score(items)
                timings[name] = time.perf_counter() - started
                assert r.status_code == 200, (name, r.text)
                before, hostile, after = r.json()["results"]
                assert isinstance(before["scores"]["clip"], float) and isinstance(
                    after["scores"]["clip"], float
                )
                assert hostile["scores"]["len"] == 1.0  # the other scorer of the same item is untouched
                if want == "bad_input":
                    assert hostile["errors"]["clip"]["code"] == "bad_input", (name, hostile)
                    assert "clip" not in hostile["scores"]
                else:
                    assert math.isfinite(hostile["scores"]["clip"]), (name, hostile)
                assert timings[name] < TIME_BOUND_S, (name, timings[name])
            assert client.get("/health/ready").status_code == 200
            stop = True
            bg.result(timeout=30)
        growth = peak_rss(proc) - baseline
        assert others and set(others) == {200}, others
        assert growth < MEMORY_BOUND, growth / 2**20
        print(
            f"\nhostile corpus: {len(CORPUS)} cases, slowest {max(timings.values()):.3f} s "
            f"({max(timings, key=timings.get)}), peak RSS growth {growth / 2**20:.0f} MiB"
        )
        for name, t in timings.items():
            print(f"  {name}: {t * 1000:.0f} ms")
