"""Hostile inputs for the hardening tests (docs/reliability.md): images and a real-server helper.

`hostile_images()` is the image corpus: each entry is (case name, bytes, expected outcome),
where the outcome is "bad_input" (refused at admission, alone) or "score" (a finite score).
Every case is small on the wire; the bombs only claim to be large in their headers.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import psutil
from PIL import Image


def _save(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def noise(size: tuple[int, int], seed: int = 0, mode: str = "RGB") -> Image.Image:
    w, h = size
    arr = np.random.default_rng(seed).integers(0, 255, size=(h, w, 3), dtype=np.uint8)
    return Image.fromarray(arr).convert(mode)


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bomb(width: int = 100_000, height: int = 100_000) -> bytes:
    """A PNG whose header claims width x height greyscale pixels (10^10 = 10 GB decoded) with a
    few compressed rows of zeros: what a decoder that trusts the header would allocate."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    rows = zlib.compress(b"\x00" * (width + 1) * 4, 9)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", rows)
        + _png_chunk(b"IEND", b"")
    )


def jpeg_bomb(width: int = 65_000, height: int = 65_000) -> bytes:
    """A small JPEG with its frame header (SOF0) patched to claim width x height pixels."""
    data = bytearray(_save(noise((64, 64)), "JPEG"))
    at = data.index(b"\xff\xc0")
    data[at + 5 : at + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def _progressive_half() -> bytes:
    data = _save(noise((320, 240), 13), "JPEG", quality=90, progressive=True)
    return data[: len(data) // 2] + b"\xff\xd9"


def hostile_images() -> list[tuple[str, bytes, str]]:
    jpeg = _save(noise((320, 240), 1), "JPEG", quality=90)
    png = _save(noise((200, 150), 2), "PNG")
    cases: list[tuple[str, bytes, str]] = []
    for frac in (0.1, 0.5, 0.9):
        cases.append((f"jpeg cut at {frac:.0%}", jpeg[: int(len(jpeg) * frac)], "bad_input"))
        cases.append((f"png cut at {frac:.0%}", png[: int(len(png) * frac)], "bad_input"))
    cases += [
        ("jpeg without its last 2 bytes (EOI)", jpeg[:-2], "bad_input"),
        ("jpeg without its last byte", jpeg[:-1], "bad_input"),
        ("png without its IEND chunk", png[:-12], "bad_input"),
        # well-formed but short: libjpeg fills the missing scan with grey and only warns; the strict
        # decode (serve.images.strict_jpeg) turns that warning into a refusal
        (
            "jpeg cut at 50% with its EOI marker re-appended",
            jpeg[: len(jpeg) // 2] + b"\xff\xd9",
            "bad_input",
        ),
        (
            "jpeg cut at 90% with its EOI marker re-appended",
            jpeg[: len(jpeg) * 9 // 10] + b"\xff\xd9",
            "bad_input",
        ),
        ("progressive jpeg cut at 50% with its EOI marker re-appended", _progressive_half(), "bad_input"),
        (
            "png cut at 50% with an IEND chunk re-appended",
            png[: len(png) // 2] + _png_chunk(b"IEND", b""),
            "bad_input",
        ),
        ("png with a corrupt IDAT", png[:60] + bytes(b ^ 0x5A for b in png[60:200]) + png[200:], "bad_input"),
        ("empty bytes", b"", "bad_input"),
        ("not an image", b"definitely not an image" * 10, "bad_input"),
        ("jpeg magic then garbage", b"\xff\xd8garbage\xff\xd9", "bad_input"),
        ("png bomb 100000x100000 (10 GB decoded)", png_bomb(), "bad_input"),
        ("jpeg bomb 65000x65000", jpeg_bomb(), "bad_input"),
        (
            "png 5000x5000 claimed (over max_image_pixels, under Pillow's own limit)",
            png_bomb(5000, 5000),
            "bad_input",
        ),
        ("png 1x4000", _save(noise((1, 4000), 3), "PNG"), "bad_input"),
        ("png 4000x1", _save(noise((4000, 1), 4), "PNG"), "bad_input"),
        ("png 210x10 (21:1)", _save(noise((210, 10), 5), "PNG"), "bad_input"),
        ("png 200x10 (20:1)", _save(noise((200, 10), 6), "PNG"), "score"),
        ("cmyk jpeg", _save(noise((64, 48), 7, "CMYK"), "JPEG"), "score"),
        (
            "16-bit greyscale png",
            _save(
                Image.fromarray(np.random.default_rng(8).integers(0, 65535, (48, 64), dtype=np.uint16)), "PNG"
            ),
            "score",
        ),  # fmt: skip
        ("palette png with transparency", _save(noise((64, 48), 9, "P"), "PNG", transparency=0), "score"),
        ("rgba png", _save(noise((64, 48), 10, "RGBA"), "PNG"), "score"),
        ("animated gif (3 frames)", _animated("GIF"), "score"),
        ("animated png (3 frames)", _animated("PNG"), "score"),
        ("webp", _save(noise((64, 48), 11), "WEBP"), "score"),
        ("2048x2048 png (legal, large)", _save(noise((2048, 2048), 12), "PNG"), "score"),
    ]
    return cases


def _animated(fmt: str) -> bytes:
    frames = [noise((48, 32), 20 + k) for k in range(3)]
    return _save(frames[0], fmt, save_all=True, append_images=frames[1:], duration=50, loop=0)


def server_process(url: str) -> psutil.Process:
    """The `rewardplane serve` process listening on `url`'s port (started by `running_server`)."""
    port = url.rsplit(":", 1)[1]
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "serve" in cmd and "--port" in cmd and cmd[cmd.index("--port") + 1 :][:1] == [port]:
            return proc
    raise RuntimeError(f"no rewardplane serve process on port {port}")


def peak_rss(proc: psutil.Process) -> int:
    """The process's peak resident set (VmHWM), bytes."""
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


@contextmanager
def served(tmp_path: Path, yaml_text: str, *, env: dict[str, str] | None = None) -> Iterator[str]:
    """A real `rewardplane serve --config` process on a free loopback port; yields its URL."""
    from rewardplane.bench.server import running_server

    cfg = tmp_path / "service.yaml"
    cfg.write_text(yaml_text)
    with running_server(["--config", str(cfg)], tmp_path, env=env, ready_timeout_s=300) as url:
        yield url
