"""Image-text scorers on a transformers `CLIPModel`: `clip` and `pickscore`.

score = exp(logit_scale) · cos(image_embedding, text_embedding) / divisor

- `clip`: `options.divisor` defaults to 1.0, so the score equals CLIP's own `logits_per_image`
  (≈ 100·cos for OpenAI weights); set `divisor: 100` for a plain cosine.
- `pickscore`: the PickScore convention, exp(logit_scale)·cos with no divisor, on a CLIP-H
  shaped model (point `path` at a PickScore checkpoint saved as a `CLIPModel` directory).

The text is the item's prompt (its message contents when it is a conversation). Prompts repeated
within a batch are encoded once — in RL the same prompt is scored against many samples. Images
are decoded on the GPU when torchvision is importable there, else by Pillow on a thread pool;
preprocessing is torch ops on the scorer's device (`rewardplane.serve.images`).

Named shapes (random init, the real compute): `clip-vit-l-14`, `clip-vit-h-14`, `pickscore`
(= CLIP-H/14 dims) and `tiny-clip` (tests). Options: `divisor`, `seed`, `decode_threads`, and
`decode`: `device` (default: nvJPEG through torchvision when it is importable on a CUDA box) or
`host` (Pillow threads, then one copy to the device). nvJPEG and libjpeg round a few pixels
differently, so `host` is part of the identity. `cuda_graphs: true` (CUDA only) replays both towers
as CUDA graphs captured at bucket batch sizes (`rewardplane.serve.graphs`); texts are then padded
to CLIP's 77 positions and run without a padding mask, as CLIP was trained: attention is causal
and the score reads the end-of-text position, so the padding after it changes nothing.

Admission (`prepare`, on the batcher's admission threads): each image's header is checked
(more than the service's `limits.max_image_pixels` or an aspect ratio over
`options.max_image_aspect`, default 20:1, is refused without decoding) and then decoded in full
(read from the request's prefetched decode when there is one), so a truncated, corrupt or
hostile image is that item's `bad_input` and never reaches a batch (docs/reliability.md).
"""

from __future__ import annotations

import logging
import time
from typing import Any, ClassVar, Literal

from pydantic import Field

from rewardplane.core.errors import ConfigError
from rewardplane.serve.admission import IMAGE, PROMPT
from rewardplane.serve.graphs import BucketGraphs, bucket_sizes
from rewardplane.serve.images import (
    DEFAULT_MAX_ASPECT,
    DEFAULT_MAX_PIXELS,
    ImageDecoder,
    ImageRejected,
    Preprocess,
    decode_rgb,
    inspect_image,
)
from rewardplane.serve.protocol import ItemError, ScoreItem
from rewardplane.serve.scorers.common import ModelScorer, as_text, torch_dtype, weights_digest
from rewardplane.serve.scorers.options import ScorerOptions

log = logging.getLogger(__name__)

_VIT_H = {
    "vision": {
        "hidden_size": 1280,
        "intermediate_size": 5120,
        "num_hidden_layers": 32,
        "num_attention_heads": 16,
        "patch_size": 14,
        "image_size": 224,
        "hidden_act": "gelu",
    },
    "text": {
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "max_position_embeddings": 77,
        "hidden_act": "gelu",
        "vocab_size": 49408,
    },
    "projection_dim": 1024,
}
CLIP_SHAPES: dict[str, dict[str, Any]] = {
    # OpenAI ViT-L/14 (224 px): ≈ 175 GFLOP per image-text pair.
    "clip-vit-l-14": {
        "vision": {
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
            "patch_size": 14,
            "image_size": 224,
            "hidden_act": "quick_gelu",
        },
        "text": {
            "hidden_size": 768,
            "intermediate_size": 3072,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "max_position_embeddings": 77,
            "hidden_act": "quick_gelu",
            "vocab_size": 49408,
        },
        "projection_dim": 768,
    },
    # OpenCLIP ViT-H/14 (what PickScore fine-tunes): ≈ 380 GFLOP per pair.
    "clip-vit-h-14": _VIT_H,
    "pickscore": _VIT_H,
    "tiny-clip": {
        "vision": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "patch_size": 8,
            "image_size": 32,
            "hidden_act": "quick_gelu",
        },
        "text": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "max_position_embeddings": 77,
            "hidden_act": "quick_gelu",
        },
        "projection_dim": 16,
    },
}
_CORPUS = [
    "a photo of a cat",
    "a painting of a dog on the beach",
    "an astronaut riding a horse",
    "a red cube on a blue sphere",
    "hello world",
] * 8


def shape_tokenizer():
    """A BPE tokenizer that, like CLIP's, wraps every text in bos ... eos."""
    from tokenizers import processors

    from rewardplane.data.builtin_tokenizer import SPECIAL_TOKENS, build_tokenizer

    tok = build_tokenizer(_CORPUS, vocab_size=400, chat_template=False)
    bos, eos = SPECIAL_TOKENS["bos_token"], SPECIAL_TOKENS["eos_token"]
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", special_tokens=[(bos, tok.bos_token_id), (eos, tok.eos_token_id)]
    )
    return tok


def shape_config(shape: str, tokenizer):
    from transformers import CLIPConfig

    dims = CLIP_SHAPES[shape]
    text = {
        "vocab_size": len(tokenizer),
        **dims["text"],
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    text["vocab_size"] = max(text["vocab_size"], len(tokenizer))
    return CLIPConfig(text_config=text, vision_config=dims["vision"], projection_dim=dims["projection_dim"])


class ImageOptions(ScorerOptions):
    seed: int = 0
    """Named shapes: the seed of the random initialisation."""
    decode: Literal["device", "host"] = "device"
    """Where images decode: `device` (nvJPEG through torchvision on a CUDA box, else the host) or
    `host` (Pillow threads, then one copy to the device); they round a few pixels differently."""
    decode_threads: int = Field(4, ge=1)
    """Host decoding threads."""
    cuda_graphs: bool = False
    """CUDA only: replay both towers as CUDA graphs captured at bucket batch sizes (texts padded
    to 77 positions)."""
    max_image_aspect: float = Field(DEFAULT_MAX_ASPECT, ge=1)
    """An image whose longer side is over this many times its shorter one is `bad_input`, never decoded."""

    not_in_identity: ClassVar[frozenset[str]] = frozenset({"decode_threads", "max_image_aspect"})


class ClipOptions(ImageOptions):
    divisor: float = Field(1.0, gt=0)
    """score = exp(logit_scale) · cos / divisor: 1.0 is CLIP's own `logits_per_image`; 100 a
    plain cosine with OpenAI weights."""


class ClipScorer(ModelScorer):
    kind: ClassVar[str] = "clip"
    modality: ClassVar = "image_text"
    reads: ClassVar[frozenset[str]] = frozenset({PROMPT, IMAGE})
    """The caption (the prompt) and the image; never the response."""
    Options = ClipOptions
    shapes: ClassVar[tuple[str, ...]] = tuple(CLIP_SHAPES)

    def __init__(self, name: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(name, *args, **kwargs)
        self.divisor = getattr(self.options, "divisor", 1.0)
        if self.options.cuda_graphs and not str(self.device).startswith("cuda"):
            raise ConfigError(
                f"scorer {name!r}: options.cuda_graphs needs a CUDA device, not {self.device!r}"
            )
        self.max_image_pixels = DEFAULT_MAX_PIXELS
        self.preprocess = self.decoder = None
        self._graphs: dict[str, BucketGraphs] = {}

    def limit_image_pixels(self, max_pixels: int) -> None:
        """The service's `limits.max_image_pixels` (the backend calls this before `load`)."""
        self.max_image_pixels = int(max_pixels)
        if isinstance(self.decoder, ImageDecoder):
            self.decoder.max_pixels = self.max_image_pixels

    def load(self) -> None:
        import torch
        from transformers import AutoTokenizer, CLIPModel

        dtype = torch_dtype(self.dtype)
        if self.shape is not None:
            tokenizer = shape_tokenizer()
            config = shape_config(self.shape, tokenizer)
            seed = self.options.seed
            torch.manual_seed(seed)
            # Initialise on the CPU, in fp32, then move: CUDA's random kernels size their grid
            # from the SM count, so the same seed gives other weights under an MPS partition
            # (and on another GPU model), and the identity below would name different models.
            with torch.device("cpu"):
                model = CLIPModel._from_config(config, dtype=torch.float32)
            self._weights = f"shape:{self.shape}:seed={seed}"
        else:
            tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
            model = CLIPModel.from_pretrained(self.path, local_files_only=True, dtype=dtype)
            self._weights = weights_digest(self.path)
        self.model = model.to(device=self.device, dtype=dtype).eval()
        self.tokenizer = tokenizer
        self.preprocess = Preprocess.from_model_dir(self.path, model.config.vision_config.image_size)
        self.decoder = ImageDecoder(
            self.device,
            threads=self.options.decode_threads,
            on_device=self.options.decode == "device",
            max_pixels=self.max_image_pixels,
            max_aspect=self.options.max_image_aspect,
        )
        if self.options.cuda_graphs:
            self._capture_graphs()

    def _capture_graphs(self) -> None:
        import torch

        sizes = bucket_sizes(self.max_batch_size)
        side = self.preprocess.size
        (ids,) = self._text_inputs(["a photo"])

        def pixels(n: int):
            return (torch.randn(n, 3, side, side, device=self.device, dtype=self.model.dtype),)

        started = time.perf_counter()
        self._graphs = {
            "image": BucketGraphs(self._image_tower, pixels, sizes, device=self.device),
            "text": BucketGraphs(
                self._text_tower, lambda n: (ids.expand(n, -1).clone(),), sizes, device=self.device
            ),
        }
        log.info(
            "scorer %s: captured %d CUDA graphs (batch sizes %s) in %.1f s",
            self.name, 2 * len(sizes), sizes, time.perf_counter() - started,
        )  # fmt: skip

    def before_offload(self) -> None:
        """Lifecycle (docs/lifecycle.md): the graphs hold the weights' device addresses and a
        private memory pool, so they go before the weights move (and the pool is freed)."""
        self._graphs = {}

    def after_onload(self) -> None:
        """Lifecycle: the weights are back at new addresses; capture the graphs again."""
        if self.options.cuda_graphs:
            self._capture_graphs()

    def warmup_item(self) -> ScoreItem:
        import io

        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (64, 48), (120, 30, 200)).save(buf, format="JPEG")
        return ScoreItem(id="warmup", prompt="a purple square", response="", image=buf.getvalue())

    def _text_inputs(self, texts: list[str]) -> tuple:
        """Token ids (and, eager, the padding mask) on the device; graphs need all 77 positions."""
        padding = "max_length" if self.options.cuda_graphs else True
        enc = self.tokenizer(texts, padding=padding, truncation=True, max_length=77, return_tensors="pt")
        ids = enc["input_ids"].to(self.device)
        return (ids,) if self.options.cuda_graphs else (ids, enc["attention_mask"].to(self.device))

    def _text_tower(self, ids, mask=None):
        pooled = self.model.text_model(input_ids=ids, attention_mask=mask).pooler_output
        return self.model.text_projection(pooled)

    def _image_tower(self, pixels):
        pooled = self.model.vision_model(pixel_values=pixels).pooler_output
        return self.model.visual_projection(pooled)

    def encode_text(self, texts: list[str]):
        tower = self._graphs.get("text", self._text_tower)
        return tower(*self._text_inputs(texts))

    def encode_images(self, pixels):
        return self._graphs.get("image", self._image_tower)(pixels)

    def prepare(self, item: ScoreItem) -> ScoreItem | ItemError:
        """Admission: header limits without decoding, then a full decode (a prefetched one is
        read, not redone); any failure is this item's `bad_input`. Returns the item itself: the
        batch reads the pixels from the shared decoder (or decodes again when nothing holds them),
        so a long queue never holds decoded pixels for every waiting item."""
        if item.image is None:
            return ItemError("bad_input", "item has no image")
        try:
            inspect_image(
                item.image, max_pixels=self.max_image_pixels, max_aspect=self.options.max_image_aspect
            )
        except ImageRejected as exc:
            return ItemError("bad_input", str(exc)[:300])
        holds = getattr(self.decoder, "holds", None)
        if holds is not None and holds(item.image):  # prefetched on arrival: read, do not redo
            (decoded,) = self.decoder.decode([item.image])
            if isinstance(decoded, BaseException) or decoded is None:
                return ItemError("bad_input", f"image does not decode: {decoded}"[:300])
            return item
        # Not held: check with a full Pillow decode here (CPU, this admission thread), never with
        # nvJPEG, which the scorer thread and the prefetch drainer may be using at this moment.
        try:
            decode_rgb(item.image, max_pixels=self.max_image_pixels, max_aspect=self.options.max_image_aspect)
        except ImageRejected as exc:
            return ItemError("bad_input", str(exc)[:300])
        return item

    def score_batch(self, items: list[ScoreItem]) -> list[float | ItemError]:
        import torch

        results: list[float | ItemError] = [ItemError("bad_input", "item has no image")] * len(items)
        decoded = self.decoder.decode([i.image or b"" for i in items])
        ok = []
        for k, (item, img) in enumerate(zip(items, decoded, strict=True)):
            if item.image is None:
                continue
            if isinstance(img, BaseException) or img is None:
                results[k] = ItemError("bad_image", f"could not decode image: {img}"[:300])
            else:
                ok.append(k)
        if not ok:
            return results
        texts = [as_text(items[k].prompt) for k in ok]
        unique = list(dict.fromkeys(texts))  # repeated prompts are encoded once
        index = torch.tensor([unique.index(t) for t in texts], device=self.device)
        with torch.inference_mode():
            pixels = self.preprocess([decoded[k] for k in ok], self.device, torch_dtype(self.dtype))
            img = self.encode_images(pixels).float()
            txt = self.encode_text(unique).float()[index]
            cos = torch.nn.functional.cosine_similarity(img, txt, dim=-1)
            scores = (self.model.logit_scale.float().exp() * cos / self.divisor).cpu().tolist()
        for k, s in zip(ok, scores, strict=True):
            results[k] = s
        return results

    def info_extra(self) -> dict[str, Any]:
        return {
            **super().info_extra(),
            "divisor": self.divisor,
            "image_size": self.preprocess.size,
            "decode_on_device": self.decoder.on_device,
            "cuda_graph_sizes": self._graphs["image"].sizes if self._graphs else [],
        }


class PickScoreScorer(ClipScorer):
    """PickScore: exp(logit_scale)·cos on a CLIP-H/14 model; the divisor is fixed at 1."""

    kind: ClassVar[str] = "pickscore"
    Options = ImageOptions
