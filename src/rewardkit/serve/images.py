"""Image checks at the door and CLIP preprocessing as tensor ops.

`check_image` runs in the request handler and only reads the header (format and size) plus
the end-of-stream marker, so an undecodable, truncated or oversized image is a 422/413 before
it reaches a queue, at a cost of microseconds. The full decode happens in the scorer's batch:
on the GPU with `torchvision.io.decode_jpeg(device=...)` when torchvision is importable,
otherwise with Pillow on a thread pool. Resizing, cropping and normalising are the same torch
ops on either path, so CPU and GPU serving agree.
"""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rewardkit.serve.protocol import ServeError

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

_JPEG_SOI, _JPEG_EOI = b"\xff\xd8", b"\xff\xd9"
_PNG_MAGIC, _PNG_IEND = b"\x89PNG\r\n\x1a\n", b"IEND\xaeB`\x82"


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


def _pil_decode(data: bytes):
    import numpy as np
    import torch
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        arr = np.asarray(img.convert("RGB"))
    return torch.from_numpy(arr.copy()).permute(2, 0, 1)


class ImageDecoder:
    """Bytes -> uint8 CHW tensors; per image either a tensor or the exception that decoding raised."""

    def __init__(self, device: str, *, threads: int = 4, on_device: bool = True) -> None:
        """`on_device=False` decodes with Pillow even on a GPU (the `decode: host` scorer option)."""
        self.device = device
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
        todo = list(range(len(blobs)))
        if self._tvio is not None:
            import torch

            jpeg = [i for i in todo if blobs[i][:2] == _JPEG_SOI]
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
        futures = {i: self._pool.submit(_pil_decode, blobs[i]) for i in todo}
        for i, fut in futures.items():
            try:
                results[i] = fut.result()
            except Exception as exc:
                results[i] = exc
        return results
