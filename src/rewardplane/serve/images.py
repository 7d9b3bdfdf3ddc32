"""Image checks and decoding, and CLIP preprocessing as tensor ops.

Every image is judged on its own (docs/reliability.md): `inspect_image` reads only the header
(format, width, height) and the end-of-stream marker, so a decompression bomb (more than
`max_pixels`), an extreme aspect ratio (over `max_aspect`:1, whose shortest-side resize would
blow the long side up to hundreds of thousands of pixels) and a JPEG/PNG cut short are refused
before a single pixel is decoded. `ImageDecoder.decode` runs that check on every blob before any
decode path (nvJPEG on the GPU, Pillow on a thread pool), so no path can be made to allocate for
a bomb; Pillow then decodes fully (`load()`), so a truncated or corrupt stream raises instead of
returning a half-grey picture. CMYK, palette, 16-bit and animated images (first frame) become
8-bit RGB. Image scorers run this at admission (`ClipScorer.prepare`): a refused image is that
item's `bad_input`, never its request's or its batch's failure.

`check_image` is the older whole-request check (a `ServeError`), kept for trainer routes.
Resizing, cropping and normalising are the same torch ops on either decode path, so CPU and GPU
serving agree.
"""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rewardplane.serve.protocol import ServeError

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

_JPEG_SOI, _JPEG_EOI = b"\xff\xd8", b"\xff\xd9"
_PNG_MAGIC, _PNG_IEND = b"\x89PNG\r\n\x1a\n", b"IEND\xaeB`\x82"

DEFAULT_MAX_PIXELS = 4096 * 4096
"""The service's `limits.max_image_pixels` default; a scorer built outside a service uses it."""
DEFAULT_MAX_ASPECT = 20.0
"""Longest side / shortest side above which an image is refused (`options.max_image_aspect`)."""


class ImageRejected(ValueError):
    """An image refused by its header or its decode; the item fails alone (`bad_input`)."""


_STRICT_JPEG_SPACES = ("YCbCr", "Gray", "RGB")
"""Colour spaces whose strict libjpeg-turbo decode gives Pillow's pixels exactly (tested); CMYK and
YCCK keep Pillow's conversion (Adobe inversion) after a strict check."""


def strict_jpeg(data: bytes, *, pixels: bool = True):
    """Decode a JPEG with libjpeg-turbo in strict mode (`simplejpeg`): any libjpeg warning, such as
    corrupt or missing entropy-coded data, is an `ImageRejected`. Returns HWC uint8 RGB pixels, or
    None when `pixels` is False or the colour space is left to Pillow (CMYK/YCCK). With
    `pixels=False` the stream is still Huffman-decoded in full but only at 1/8 scale (the cheap
    check run before nvJPEG, which would fill the gap silently)."""
    import simplejpeg

    try:
        colour = simplejpeg.decode_jpeg_header(data)[2]
        if not pixels or colour not in _STRICT_JPEG_SPACES:
            simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True, min_height=1, min_width=1)
            return None
        return simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)
    except ValueError as exc:
        raise ImageRejected(f"corrupt JPEG: {exc}"[:300]) from None


def inspect_image(
    data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, max_aspect: float = DEFAULT_MAX_ASPECT
) -> tuple[int, int, str]:
    """(width, height, format) from the header alone; `ImageRejected` for an empty, unknown,
    oversized (a decompression bomb), extreme-aspect or truncated JPEG/PNG image. No decoding."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise ImageRejected("image is empty")
    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            fmt = img.format or "?"
    except Image.DecompressionBombError as exc:
        raise ImageRejected(f"image refused without decoding: {exc}") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as exc:
        raise ImageRejected(f"not a decodable image: {type(exc).__name__}: {exc}"[:300]) from None
    if width < 1 or height < 1:
        raise ImageRejected(f"image has no pixels ({width}x{height})")
    if width * height > max_pixels:
        raise ImageRejected(
            f"image has {width}x{height} = {width * height} pixels, over max_image_pixels {max_pixels} "
            "(refused without decoding)"
        )
    if max(width, height) > max_aspect * min(width, height):
        raise ImageRejected(
            f"image is {width}x{height}, an aspect ratio over max_image_aspect {max_aspect:g}:1"
        )
    if fmt == "JPEG" and not data.rstrip(b"\x00").endswith(_JPEG_EOI):
        raise ImageRejected("truncated JPEG (no end-of-image marker)")
    if fmt == "PNG" and _PNG_IEND not in data[-64:]:
        raise ImageRejected("truncated PNG (no IEND chunk)")
    return width, height, fmt


def decode_rgb(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, max_aspect: float = DEFAULT_MAX_ASPECT):
    """Checked full decode with Pillow → uint8 CHW RGB tensor; `ImageRejected` if it cannot be.

    The header is checked first (`inspect_image`), then every pixel is decoded (a JPEG strictly by
    `strict_jpeg`, everything else by Pillow's `load()`), so a stream that stops or is corrupt
    raises here. 16-bit greyscale keeps its top 8 bits (Pillow's
    own conversion would clip it to white); animated images give their first frame."""
    import numpy as np
    import torch
    from PIL import Image

    _, _, fmt = inspect_image(data, max_pixels=max_pixels, max_aspect=max_aspect)
    if fmt == "JPEG":
        arr = strict_jpeg(data)
        if arr is not None:
            return torch.from_numpy(arr.copy()).permute(2, 0, 1)
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            if img.mode in ("I", "F") or img.mode.startswith("I;16"):
                grey = np.asarray(img).astype(np.float64)
                if img.mode != "F":
                    grey = grey / 257.0  # 0..65535 → 0..255
                grey = np.clip(np.rint(grey), 0, 255).astype(np.uint8)
                arr = np.stack([grey] * 3, axis=-1)
            else:
                arr = np.asarray(img.convert("RGB"))
    except ImageRejected:
        raise
    except Exception as exc:  # Pillow raises OSError, ValueError, SyntaxError, struct.error, ...
        raise ImageRejected(f"image does not decode: {type(exc).__name__}: {exc}"[:300]) from None
    return torch.from_numpy(arr.copy()).permute(2, 0, 1)


def check_image(data: bytes, max_pixels: int, *, where: str = "image") -> None:
    """Reject what cannot be an image before queueing it (structure only, no full decode)."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise ServeError("bad_image", f"{where} is empty")
    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            fmt = img.format
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ServeError("bad_image", f"{where} is not a decodable image: {exc}") from None
    if width * height > max_pixels:
        raise ServeError("image_too_large", f"{where} has {width}x{height} pixels, limit {max_pixels}")
    if fmt == "JPEG" and not data.rstrip(b"\x00").endswith(_JPEG_EOI):
        raise ServeError("bad_image", f"{where} is a truncated JPEG (no end-of-image marker)")
    if fmt == "PNG" and _PNG_IEND not in data[-64:]:
        raise ServeError("bad_image", f"{where} is a truncated PNG (no IEND chunk)")


@dataclass(frozen=True)
class Preprocess:
    """CLIP-style preprocessing: shortest side to `size` (bicubic, antialiased), center crop, normalise."""

    size: int = 224
    mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    std: tuple[float, float, float] = OPENAI_CLIP_STD

    @classmethod
    def from_model_dir(cls, path: str | None, default_size: int) -> Preprocess:
        import json
        from pathlib import Path

        cfg_path = Path(path) / "preprocessor_config.json" if path else None
        if cfg_path is None or not cfg_path.is_file():
            return cls(size=default_size)
        cfg = json.loads(cfg_path.read_text())
        crop = cfg.get("crop_size", default_size)
        size = crop.get("height", default_size) if isinstance(crop, dict) else int(crop)
        return cls(
            size=size,
            mean=tuple(cfg.get("image_mean", OPENAI_CLIP_MEAN)),
            std=tuple(cfg.get("image_std", OPENAI_CLIP_STD)),
        )

    def __call__(self, images, device, dtype):
        """uint8 CHW tensors (any sizes) -> normalised [N, 3, size, size] tensor on `device`."""
        import torch
        import torch.nn.functional as F

        # Same-sized images (the common case: one generator, one resolution) resize in one call.
        groups: dict[tuple[int, int], list[int]] = {}
        for k, img in enumerate(images):
            groups.setdefault(tuple(img.shape[-2:]), []).append(k)
        out: list = [None] * len(images)
        for (h, w), idx in groups.items():
            x = torch.stack([images[k].to(device=device, non_blocking=True) for k in idx]).float()
            scale = self.size / min(h, w)
            nh, nw = max(self.size, round(h * scale)), max(self.size, round(w * scale))
            if (nh, nw) != (h, w):
                x = F.interpolate(x, size=(nh, nw), mode="bicubic", antialias=True, align_corners=False)
            top, left = (nh - self.size) // 2, (nw - self.size) // 2
            crop = x[..., top : top + self.size, left : left + self.size]
            for j, k in enumerate(idx):
                out[k] = crop[j : j + 1]
        batch = torch.cat(out).clamp_(0, 255).div_(255.0)
        mean = torch.tensor(self.mean, device=device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=device).view(1, 3, 1, 1)
        return ((batch - mean) / std).to(dtype)


def _strict_check(data: bytes) -> ImageRejected | None:
    try:
        strict_jpeg(data, pixels=False)
    except ImageRejected as exc:
        return exc
    return None


def _pil_decode(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, max_aspect: float = DEFAULT_MAX_ASPECT):
    return decode_rgb(data, max_pixels=max_pixels, max_aspect=max_aspect)


class ImageDecoder:
    """Bytes -> uint8 CHW tensors; per image either a tensor or the exception that decoding raised.

    Every blob's header is checked (`inspect_image`) before any decoder sees it, so a bomb or an
    extreme aspect ratio is an `ImageRejected` value here, whatever the decode path."""

    def __init__(
        self,
        device: str,
        *,
        threads: int = 4,
        on_device: bool = True,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        max_aspect: float = DEFAULT_MAX_ASPECT,
    ) -> None:
        """`on_device=False` decodes with Pillow even on a GPU (the `decode: host` scorer option)."""
        self.device = device
        self.max_pixels = max_pixels
        self.max_aspect = max_aspect
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="image-decode")
        tvio = None
        if device.startswith("cuda") and on_device:
            try:
                import torchvision.io as tvio  # optional: only where already installed (the GPU box)
            except Exception:
                tvio = None
        self._tvio = tvio

    @property
    def on_device(self) -> bool:
        return self._tvio is not None

    def decode(self, blobs: list[bytes]) -> list[object]:
        results: list[object] = [None] * len(blobs)
        todo = []
        for i, blob in enumerate(blobs):
            try:
                inspect_image(blob, max_pixels=self.max_pixels, max_aspect=self.max_aspect)
                todo.append(i)
            except ImageRejected as exc:
                results[i] = exc
        if self._tvio is not None:
            import torch

            jpeg = [i for i in todo if blobs[i][:2] == _JPEG_SOI]
            # nvJPEG, like Pillow, fills a stream cut short with grey: check strictly on the CPU
            # first (1/8-scale libjpeg-turbo decode, every coefficient read) and refuse on a warning.
            for i, checked in zip(jpeg, self._pool.map(_strict_check, [blobs[i] for i in jpeg]), strict=True):
                if checked is not None:
                    results[i] = checked
            jpeg = [i for i in jpeg if results[i] is None]
            if jpeg:
                tensors = [torch.frombuffer(bytearray(blobs[i]), dtype=torch.uint8) for i in jpeg]
                mode = self._tvio.ImageReadMode.RGB
                try:
                    decoded = self._tvio.decode_jpeg(tensors, mode=mode, device=self.device)
                except RuntimeError:
                    # One bad JPEG fails the batched call: decode one by one, still on the device;
                    # what the GPU decoder refuses (some progressive/CMYK files) goes to Pillow.
                    decoded = []
                    for t in tensors:
                        try:
                            decoded.append(self._tvio.decode_jpeg(t, mode=mode, device=self.device))
                        except RuntimeError:
                            decoded.append(None)
                for i, t in zip(jpeg, decoded, strict=True):
                    results[i] = t
                todo = [i for i in todo if results[i] is None]
        futures = {
            i: self._pool.submit(_pil_decode, blobs[i], self.max_pixels, self.max_aspect) for i in todo
        }
        for i, fut in futures.items():
            try:
                results[i] = fut.result()
            except Exception as exc:
                results[i] = exc
        return results
