"""The scalar-head reward model: any transformers backbone plus a bias-free fp32 `Linear(hidden, 1)`.

The score is the head applied to the backbone's last hidden state at each branch's
`score_index` (its last completion token). The head stays in fp32 even under bf16 autocast:
Bradley–Terry only sees score *differences*, and bf16 rounding of two nearby scores would
turn small margins into ties. A bias is pointless for the same reason (it cancels in
s_c − s_r) and is left out so exported `*ForSequenceClassification` heads match exactly.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from rewardplane.core.errors import ConfigError, reading
from rewardplane.data.collate import Batch, block_attention_mask
from rewardplane.models.attention import packed_attention, resolve_attn_implementation
from rewardplane.models.config import ModelConfig

# Bidirectional backbones: packed rows need an explicit block-diagonal mask for these, while
# decoders get their block-causal mask from restarting position_ids inside transformers.
ENCODER_MODEL_TYPES = frozenset(
    {
        "albert",
        "bert",
        "camembert",
        "deberta",
        "deberta-v2",
        "distilbert",
        "electra",
        "ernie",
        "modernbert",
        "mpnet",
        "roberta",
        "xlm-roberta",
    }
)


def is_encoder(config: Any) -> bool:
    return getattr(config, "model_type", None) in ENCODER_MODEL_TYPES


def build_backbone(
    spec: dict[str, Any], *, vocab_size: int | None = None, auto_class: Any = None
) -> nn.Module:
    """Instantiate an `AutoModel` backbone from a model spec (see docs/training.md, `model:`).

    `auto_class` (default `AutoModel`) picks the head: DPO policies pass `AutoModelForCausalLM`.

    - `path`: a local directory (or a GGUF file inside one via `gguf_file`), loaded with
      `local_files_only=True`; `trust_remote_code` only when the spec enables it. With
      `random_init`, only its config is read: the same architecture with fresh weights, the
      baseline that shows what the pretrained weights buy.
    - `tiny`: a name from `rewardplane.models.tiny.TINY_CONFIGS`, random init.
    - `config`: an inline config dict with `model_type`, random init.
    """
    from transformers import AutoConfig, AutoModel

    from rewardplane.models.tiny import tiny_config

    auto_class = auto_class or AutoModel
    attn = resolve_attn_implementation(spec.get("attn_implementation"))
    overrides = dict(spec.get("config_overrides") or {})
    if spec.get("path"):
        kwargs: dict[str, Any] = {
            "local_files_only": True,
            "trust_remote_code": bool(spec.get("trust_remote_code", False)),
            "attn_implementation": attn,
        }
        if spec.get("gguf_file"):
            kwargs["gguf_file"] = spec["gguf_file"]
        if spec.get("random_init"):
            with reading(spec["path"], "model", code="bad_model_dir"):
                config = AutoConfig.from_pretrained(spec["path"], **overrides, **kwargs)
            config._attn_implementation = attn
            return auto_class.from_config(config, dtype=torch.float32)
        with reading(spec["path"], "model", code="bad_model_dir"):
            model = auto_class.from_pretrained(spec["path"], dtype=torch.float32, **overrides, **kwargs)
        if getattr(model.config, "quantization_config", None) is not None:
            # GGUF weights are dequantised on load; the attribute would block save_pretrained.
            del model.config.quantization_config
        return model
    if spec.get("tiny"):
        # an explicit config_overrides.vocab_size (e.g. a benchmark's real vocabulary) wins
        overrides.setdefault("vocab_size", vocab_size)
        config = tiny_config(spec["tiny"], **overrides)
    elif spec.get("config"):
        inline = dict(spec["config"])
        model_type = inline.pop("model_type", None)
        if not model_type:
            raise ValueError("model.config needs a model_type")
        if vocab_size is not None:
            inline.setdefault("vocab_size", vocab_size)
        config = AutoConfig.for_model(model_type, **inline, **overrides)
    else:
        raise ValueError("model spec needs one of: path, tiny, config")
    config._attn_implementation = attn
    return auto_class.from_config(config, dtype=torch.float32)


class RewardModel(nn.Module):
    """Backbone + bias-free fp32 scalar head; `forward(batch)` returns one fp32 score per sequence."""

    head_type = "linear_last_token"

    # Checkpoints trained with score_position `end_of_turn` (before issue 24) read at the
    # template's end-of-turn marker; branches now end where `apply_chat_template` ends (ChatML's
    # "\n" after `<|im_end|>`). `read_at_end_of_turn` makes such a model step back over those
    # whitespace-only template tokens, so it scores exactly as it was trained.
    _trailing_ids: torch.Tensor | None = None

    def read_at_end_of_turn(self, tokenizer: Any) -> None:
        special = set(tokenizer.all_special_ids)
        ids = [
            i
            for i in range(len(tokenizer))
            if i not in special and tokenizer.decode([i]) and not tokenizer.decode([i]).strip()
        ]
        self._trailing_ids = torch.tensor(ids, dtype=torch.long)

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        if getattr(backbone, "pooler", None) is not None:
            # Encoders' pooler (dense + tanh on the first token) is never used by a last-token head;
            # left in place it would get no gradient, which DDP and optimizer-state loading reject.
            backbone.pooler = None
        self.backbone = backbone
        self.causal = not is_encoder(backbone.config)
        hidden = backbone.config.hidden_size
        self.head = nn.Linear(hidden, 1, bias=False, dtype=torch.float32)
        nn.init.normal_(self.head.weight, std=1.0 / (hidden + 1) ** 0.5)

    @property
    def config(self) -> Any:
        return self.backbone.config

    def forward(self, batch: Batch) -> torch.Tensor:
        kwargs: dict[str, Any] = {"input_ids": batch.input_ids, "position_ids": batch.position_ids}
        boundaries = contextlib.nullcontext({})
        if self.causal:
            kwargs["use_cache"] = False
        if batch.layout == "packed":
            if self.causal:
                # No mask: transformers detects the restarting positions, and rk_varlen gets
                # the sequence boundaries directly.
                boundaries = packed_attention(self.backbone.config, batch.position_ids)
            else:
                kwargs["attention_mask"] = block_attention_mask(batch.segment_ids)
        else:
            kwargs["attention_mask"] = batch.attention_mask
        with boundaries as extra:
            hidden = self.backbone(**kwargs, **extra).last_hidden_state
        cols = self.read_cols(batch.input_ids, batch.score_rows, batch.score_cols)
        last = hidden[batch.score_rows, cols]
        with torch.autocast(device_type=last.device.type, enabled=False):
            # sum over the size-1 output dim: a fresh tensor, not a view (FSDP2 hooks the output).
            return self.head(last.float()).sum(-1)

    def read_cols(self, input_ids: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Where the scores are read: `cols`, or for an end-of-turn checkpoint each stepped back over
        trailing template whitespace (at most 32 tokens, never past a sequence start)."""
        if self._trailing_ids is None:
            return cols
        trailing = self._trailing_ids.to(input_ids.device)
        for _ in range(32):
            step = torch.isin(input_ids[rows, cols], trailing) & (cols > 0)
            if not bool(step.any()):
                break
            cols = cols - step.long()
        return cols


def last_token_parts(model: nn.Module) -> tuple[nn.Module, nn.Module] | tuple[None, None]:
    """(backbone, head) of a decoder scored as head(hidden state at the read token) — a rewardplane
    `RewardModel`, or an HF `*ForSequenceClassification` with a `score` head (bare, or behind
    `loading.HFSequenceClassifier`) — else (None, None): encoders see the tokens after the read
    position, and pooled heads (BERT's) read elsewhere, so neither can be cut or packed."""
    if isinstance(model, RewardModel):
        return (model.backbone, model.head) if model.causal else (None, None)
    hf = model.model if getattr(model, "head_type", None) == "hf_seqcls" else model
    head, base = getattr(hf, "score", None), getattr(hf, "base_model", None)
    if head is None or base is None or base is hf or is_encoder(base.config):
        return None, None
    return base, head


def model_spec(m: ModelConfig) -> dict[str, Any]:
    """The `model:` config section as the keyword set `build_backbone` takes (exactly one source)."""
    sources = [name for name in ("tiny", "config", "path") if getattr(m, name)]
    if len(sources) != 1 and not m.init_from:
        raise ConfigError(f"model: give exactly one of tiny, config, path (got {sources or 'none'})")
    return {
        "tiny": m.tiny,
        "config": m.config,
        "path": m.path,
        "gguf_file": m.gguf_file,
        "random_init": m.random_init,
        "config_overrides": m.config_overrides,
        "attn_implementation": m.attn_implementation,
        "trust_remote_code": m.trust_remote_code,
    }
