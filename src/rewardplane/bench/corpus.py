"""The inputs a benchmark sends: a seeded corpus of distinct items, or the user's own file.

Parity across deployment modes is only meaningful over a spread of inputs: one repeated item
would hide batch-composition and precision effects that show up on other images and texts.
So the built-in corpus draws every item independently (image size, JPEG or PNG, pattern,
prompt, response) from one seed, and the same seed always gives byte-identical items, which
is what lets `qualify` compare scores per item id across separately started deployments.
Items are the protocol's own `ScoreItem`s, so whatever the wire carries, a benchmark can send.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from rewardplane.core.errors import UsageError
from rewardplane.core.hashing import sha256_bytes, sha256_json
from rewardplane.serve.protocol import ScoreItem, item_fields, read_items

IMAGE_SIZES: tuple[tuple[int, int], ...] = ((64, 64), (128, 96), (160, 160), (224, 224), (320, 240))
"""(width, height) choices: small enough to keep the client cheap, varied enough that the
scorer's resize/crop path sees more than one shape."""

_SUBJECTS = (
    "a red fox", "an old lighthouse", "a bowl of ramen", "a city street at night", "a mountain lake",
    "a vintage bicycle", "a field of sunflowers", "a robot reading a book", "a sailing boat",
    "a snowy forest", "a cup of coffee", "a desert canyon", "a jazz band", "a paper crane",
)  # fmt: skip
_STYLES = (
    "watercolor", "oil painting", "photograph", "pixel art", "pencil sketch", "3d render",
    "ukiyo-e print", "studio portrait", "long exposure", "flat illustration",
)  # fmt: skip
_DETAILS = (
    "at golden hour", "under heavy rain", "in soft morning light", "with dramatic shadows",
    "seen from above", "in a minimalist composition", "with vivid colors", "in black and white",
)  # fmt: skip
_RESPONSE_OPENERS = (
    "Here is", "This image shows", "A rendering of", "The picture depicts", "Generated:",
)  # fmt: skip


def item_digest(item: ScoreItem) -> str:
    """A hash of what an item says (not its id): prompt, response and image, and any other field
    only when set, so a corpus without them hashes as it always did."""
    fields = item_fields(item)
    del fields["id"]
    image_digest = None if item.image is None else sha256_bytes(item.image)
    core = [fields.pop("prompt"), fields.pop("response"), image_digest]
    return sha256_json([*core, fields] if fields else core)


def _pattern(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """An RGB uint8 array: gradient, checkerboard, rings or noise with random parameters."""
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    kind = int(rng.integers(4))
    base = rng.uniform(0, 255, size=3).astype(np.float32)
    if kind == 0:
        angle = rng.uniform(0, np.pi)
        ramp = (np.cos(angle) * xs / width + np.sin(angle) * ys / height) % 1.0
        img = base[None, None, :] * (1 - ramp[..., None]) + rng.uniform(0, 255, 3) * ramp[..., None]
    elif kind == 1:
        cell = int(rng.integers(4, 32))
        mask = ((xs // cell + ys // cell) % 2)[..., None]
        img = base[None, None, :] * mask + rng.uniform(0, 255, 3) * (1 - mask)
    elif kind == 2:
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        freq = rng.uniform(0.05, 0.4)
        rings = 0.5 + 0.5 * np.sin(np.hypot(xs - cx, ys - cy) * freq)
        img = base[None, None, :] * rings[..., None]
    else:
        img = rng.normal(base, rng.uniform(10, 60), size=(height, width, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def _encode(array: np.ndarray, fmt: str, quality: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    image = Image.fromarray(array, mode="RGB")
    if fmt == "jpeg":
        image.save(buf, format="JPEG", quality=quality)
    else:
        image.save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def _text(rng: np.random.Generator, index: int) -> tuple[str, str]:
    subject = _SUBJECTS[int(rng.integers(len(_SUBJECTS)))]
    style = _STYLES[int(rng.integers(len(_STYLES)))]
    detail = _DETAILS[int(rng.integers(len(_DETAILS)))]
    prompt = f"{style} of {subject} {detail}"
    if rng.random() < 0.3:
        prompt += f", variation {index}"
    opener = _RESPONSE_OPENERS[int(rng.integers(len(_RESPONSE_OPENERS)))]
    response = f"{opener} {subject} as a {style}, {detail}."
    if rng.random() < 0.5:
        response += " " + " ".join(rng.choice(_DETAILS, size=int(rng.integers(1, 4))))
    return prompt, response


def generate_corpus(size: int, *, seed: int = 0, images: bool = True) -> list[ScoreItem]:
    """`size` distinct items, identical for the same (size, seed, images)."""
    if size < 1:
        raise UsageError(f"corpus size must be >= 1, got {size}")
    rng = np.random.default_rng(seed)
    items: list[ScoreItem] = []
    seen: set[str] = set()
    while len(items) < size:
        index = len(items)
        prompt, response = _text(rng, index)
        image = None
        if images:
            dims = IMAGE_SIZES[int(rng.integers(len(IMAGE_SIZES)))]
            fmt = "jpeg" if rng.random() < 0.5 else "png"
            image = _encode(_pattern(rng, *dims), fmt, int(rng.integers(70, 96)))
        item = ScoreItem(f"s{seed}-{index:06d}", prompt, response, image)
        digest = item_digest(item)
        if digest in seen:  # astronomically rare for images; possible for text-only corpora
            continue
        seen.add(digest)
        items.append(item)
    return items


def load_inputs(path: str | Path) -> list[ScoreItem]:
    """The user's items: one wire item per JSON line (`rewardplane.serve.protocol.read_items`,
    the reader `rewardplane score` uses too), images as paths relative to the file
    (`image` or `image_path`) or base64 (`image_b64`). Ids must be unique, because scores are
    captured and compared per id."""
    return read_items(path)


def corpus_digest(items: list[ScoreItem]) -> str:
    """One hash over ids and contents: two runs are comparable per item only if these match."""
    return sha256_json([[item.id, item_digest(item)] for item in items])
