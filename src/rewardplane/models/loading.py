"""Load a reward model for scoring: rewardplane checkpoints and HF `*ForSequenceClassification` dirs.

Evaluation and the serve `rm` / `hf_seqcls` scorers call `load_reward_model` and never care
which of the two formats a directory holds. A checkpoint of another objective (a DPO policy, a
critic, a plain LM) is refused with a coded error instead of being scored with a random head.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rewardplane.core import legacy
from rewardplane.core.errors import RewardplaneError
from rewardplane.core.hashing import sha256_file
from rewardplane.data.collate import Batch
from rewardplane.data.tokenize import (
    END_OF_TURN,
    PLAIN_TEXT_MODES,
    SCORE_POSITIONS,
    TEMPLATE_END,
    TEXT_EOS,
    recorded_settings,
)
from rewardplane.models.attention import resolve_attn_implementation

FORMAT_VERSION = 1
METADATA_FILE = "rewardplane.json"
WEIGHTS_FILE = "model.safetensors"
EXPORT_FILE = "rewardplane_export.json"
"""What `rewardplane export hf` writes next to an exported model: the export check and the
checkpoint's scoring convention (`score_position`, `plain_text`)."""
OBJECTIVE = "reward_model"


def metadata_path(path: str | Path) -> Path | None:
    """The checkpoint metadata file of directory `path` (`rewardplane.json`, or `rewardkit.json`
    as checkpoints written before the rename call it), or None when it has none."""
    return legacy.first_existing(path, METADATA_FILE, legacy.CHECKPOINT_METADATA)


def is_checkpoint(path: str | Path) -> bool:
    """Whether `path` is a rewardplane (or rewardkit) checkpoint: it has a metadata file."""
    return metadata_path(path) is not None


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a name in the config vocabulary (`core.config.DTYPES`: fp32, fp16, bf16)."""
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def cast_weights(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """`module` with its parameters and saved buffers in `dtype`, its computed constants untouched:
    the model `from_pretrained(..., dtype=dtype)` builds, where `module.to(dtype)` builds another.

    Why: `.to(dtype)` also casts non-persistent buffers, the constants a model computes at
    construction and never saves: RoPE's inverse frequencies (`rotary_emb.inv_freq`), computed in
    fp32. In bf16 they carry 8 bits, so the rotation angle of position p is off by up to
    p × 2⁻⁹ rad at the highest frequency, radians at a few thousand tokens: a bf16 Llama scored
    from a rewardplane checkpoint drifted from a plain transformers forward of the same
    checkpoint (which keeps them in fp32), more with every layer (docs/benchmarks/serve_text.md,
    parity). Saved buffers (in the state dict) are weights and are cast like parameters."""
    for sub in module.modules():
        keep = sub._non_persistent_buffers_set
        for param in sub.parameters(recurse=False):
            if param.is_floating_point() and param.dtype != dtype:
                param.data = param.data.to(dtype)
        for name, buf in sub.named_buffers(recurse=False):
            if buf is not None and buf.is_floating_point() and name not in keep and buf.dtype != dtype:
                sub._buffers[name] = buf.to(dtype)
    return module


class CheckpointError(RewardplaneError):
    """A directory that is not a loadable reward model (wrong objective, head, or missing files)."""

    code = "bad_checkpoint"


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
"""Files recorded in `weight_files` (size + SHA-256) and checked before every load."""
STATE_FILES = ("optimizer.pt", "rng.pt", "trainer_state.json")


def file_digests(directory: str | Path, names: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """`{name: {"size", "sha256"}}` for the weight files of `directory` (or the given names)."""
    directory = Path(directory)
    if names is None:
        names = sorted(
            p.name
            for p in directory.iterdir()
            if p.is_file() and p.suffix in WEIGHT_SUFFIXES and p.name not in STATE_FILES
        )
    return {
        name: {"size": (directory / name).stat().st_size, "sha256": sha256_file(directory / name)}
        for name in names
    }


def verify_files(path: str | Path, meta: dict[str, Any]) -> None:
    """Check every recorded weight file's size and SHA-256 before anything reads it.

    Checkpoints record `weight_files` (`{name: {size, sha256}}`); older ones only `model_sha256`
    of `model.safetensors`, which is checked the same way. Directories without recorded digests
    (HF dirs) are not checked. A mismatch raises `CheckpointError` (code `sha256_mismatch`) with
    one line naming the file, the expected and the actual size / digest.
    """
    path = Path(path)
    recorded = meta.get("weight_files")
    if not recorded:
        legacy = meta.get("model_sha256")
        recorded = {WEIGHTS_FILE: {"sha256": legacy}} if legacy else {}
    for name, want in sorted(recorded.items()):
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{file}: missing (recorded in {METADATA_FILE})", code="missing_weights")
        size = file.stat().st_size
        expected_size = want.get("size")
        if expected_size is not None and size != expected_size:
            raise CheckpointError(
                f"{file}: sha256 mismatch: expected {expected_size} bytes sha256 {want.get('sha256')},"
                f" actual {size} bytes (truncated or replaced; the checkpoint is corrupt)",
                code="sha256_mismatch",
            )
        actual = sha256_file(file)
        if want.get("sha256") and actual != want["sha256"]:
            raise CheckpointError(
                f"{file}: sha256 mismatch: expected {want['sha256']}, actual {actual} ({size} bytes;"
                " the checkpoint is corrupt)",
                code="sha256_mismatch",
            )


def read_verified_metadata(path: str | Path) -> dict[str, Any]:
    """`read_metadata` plus `verify_files`: what every load of a checkpoint's weights goes through."""
    meta = read_metadata(path)
    verify_files(path, meta)
    return meta


def read_metadata(path: str | Path) -> dict[str, Any]:
    meta_path = metadata_path(path)
    if meta_path is None:
        raise CheckpointError(
            f"{path}: no {METADATA_FILE}; not a rewardplane checkpoint", code="not_rewardplane"
        )
    try:
        meta = json.loads(meta_path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{meta_path}: not valid JSON ({exc})", code="bad_checkpoint") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{meta_path}: not a JSON object", code="bad_checkpoint")
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format {meta.get('format_version')!r}, this rewardplane reads {FORMAT_VERSION}",
            code="format_version",
        )
    return meta


class HFSequenceClassifier(nn.Module):
    """An HF `*ForSequenceClassification` (num_labels == 1) behind the `forward(batch)` contract.

    The model runs unchanged (its own pooling: last non-pad token for decoders, pooled first
    token for BERT-style encoders), so its scores are exactly what plain transformers gives.
    That pooling needs right padding with an attention mask, hence `supported_layouts`.
    """

    supported_layouts = ("right",)
    head_type = "hf_seqcls"

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    @property
    def config(self) -> Any:
        return self.model.config

    def forward(self, batch: Batch) -> torch.Tensor:
        if batch.layout != "right":
            raise ValueError("HF sequence-classification models score right-padded batches only")
        out = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        return out.logits[:, 0].float()


def _is_seqcls_dir(path: Path) -> dict[str, Any] | None:
    config_path = path / "config.json"
    if not config_path.is_file():
        return None
    try:
        config = json.loads(config_path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{config_path}: not valid JSON ({exc})", code="bad_checkpoint") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path}: not a JSON object", code="bad_checkpoint")
    archs = config.get("architectures") or []
    return config if any(a.endswith("ForSequenceClassification") for a in archs) else None


def export_record(path: str | Path) -> dict[str, Any]:
    """The `rewardplane_export.json` of an HF directory, or {} (a directory `rewardplane export hf`
    did not write, or an unreadable record)."""
    try:
        record_path = legacy.first_existing(path, EXPORT_FILE, legacy.EXPORT_RECORD)
        record = json.loads(record_path.read_text()) if record_path else None
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return record if isinstance(record, dict) else {}


def exported_plain_text(path: str | Path) -> str | None:
    """How the checkpoint an HF directory was exported from tokenised plain-text rows
    (`plain_text` in its `rewardplane_export.json`), or None: a directory `rewardplane export hf` did
    not write, an export from before the key was recorded, or an unreadable record."""
    mode = export_record(path).get("plain_text")
    return mode if mode in PLAIN_TEXT_MODES else None


def recorded_plain_text(path: str | Path) -> str | None:
    """How the model in directory `path` was trained to tokenise plain-text rows, where the
    directory records it: a rewardplane checkpoint's `plain_text` (none recorded: `chat_template`,
    rewardplane before issue 24, as `data.tokenize.recorded_settings` reads it) or an export's
    (`exported_plain_text`); None for a directory that records nothing (a Hugging Face model) or
    whose rewardplane.json cannot be read (loading refuses it, with the reason)."""
    path = Path(path)
    if not is_checkpoint(path):
        return exported_plain_text(path)
    try:
        meta = read_metadata(path)
    except CheckpointError:
        return None
    mode = recorded_settings(meta)["plain_text"]
    if mode not in PLAIN_TEXT_MODES:
        raise CheckpointError(
            f"{path}: {METADATA_FILE} records plain_text {mode!r}; this rewardplane knows"
            f" {', '.join(PLAIN_TEXT_MODES)}",
            code="bad_checkpoint",
        )
    return mode


def recorded_score_position(path: str | Path) -> str | None:
    """Where the model in directory `path` was trained to be read, where the directory records
    it: a rewardplane checkpoint's `score_position` (none recorded: `end_of_turn`, rewardplane
    before issue 24) or an export's (`rewardplane_export.json`); None for a directory that
    records nothing (a Hugging Face model) or whose record cannot be read."""
    path = Path(path)
    if not is_checkpoint(path):
        position = export_record(path).get("score_position")
        return position if position in SCORE_POSITIONS else None
    try:
        meta = read_metadata(path)
    except CheckpointError:
        return None
    return meta.get("score_position") or END_OF_TURN


HF_REFUSED_PREFIX = "rewardplane-"
"""config.json `model_type` prefix for families transformers cannot load as this reward model."""
MASKED_MODEL_TYPE_KEY = "rewardplane_model_type"
"""Where config.json keeps the real `model_type` of such a family (`rewardkit_model_type` before
the rename)."""


def hf_seqcls_layout(config: Any) -> str | None:
    """The base-model prefix of the family's `*ForSequenceClassification` when that class is exactly a
    rewardplane reward model (backbone + bias-free `score` Linear read at the last token), else None."""
    from transformers import AutoModelForSequenceClassification

    probe = config.__class__.from_dict(config.to_dict())
    probe.num_labels = 1
    try:
        with torch.device("meta"):
            seqcls = AutoModelForSequenceClassification.from_config(probe)
    except (ValueError, KeyError):
        return None
    head = getattr(seqcls, "score", None)
    if not isinstance(head, nn.Linear) or head.bias is not None or head.out_features != 1:
        return None
    prefix = seqcls.base_model_prefix
    return prefix if isinstance(getattr(seqcls, prefix, None), nn.Module) else None


def write_model_files(
    directory: str | Path, state_dict: dict[str, torch.Tensor], config: Any, tokenizer: Any
) -> str:
    """Write model.safetensors (backbone + head), config.json and tokenizer files; return the weights' SHA-256.

    The directory is a valid Hugging Face `*ForSequenceClassification` (num_labels 1) for the
    families whose classifier is exactly this reward model (Llama, Qwen2, Mistral, Gemma, ...):
    weights are named as transformers names them (`model.*`, `score.weight`), the config names
    that architecture and carries the tokenizer's pad / bos / eos ids, so
    `AutoModelForSequenceClassification.from_pretrained(CKPT)` loads the trained head. For the
    other families (BERT-style encoders pool differently) the config's `model_type` is
    `rewardplane-<type>`, which transformers refuses loudly instead of building a random head.
    The caller writes `rewardplane.json` last, inside a staged directory, so a reader never sees
    weights without metadata.
    """
    from safetensors.torch import save_file

    directory = Path(directory)
    config = config.__class__.from_dict(config.to_dict())
    config.num_labels = 1
    if tokenizer is not None:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        config.pad_token_id, config.bos_token_id = pad, tokenizer.bos_token_id
        config.eos_token_id = tokenizer.eos_token_id
    prefix = hf_seqcls_layout(config)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
    if prefix is not None:
        tensors = {_to_hf_name(k, prefix): v for k, v in tensors.items()}
        from transformers import AutoModelForSequenceClassification

        with torch.device("meta"):
            config.architectures = [type(AutoModelForSequenceClassification.from_config(config)).__name__]
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    config.save_pretrained(directory)
    if prefix is None:
        config_path = directory / "config.json"
        data = json.loads(config_path.read_text())
        data[MASKED_MODEL_TYPE_KEY] = data["model_type"]
        data["model_type"] = HF_REFUSED_PREFIX + data["model_type"]
        data["architectures"] = ["RewardplaneRewardModel"]
        config_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    return sha256_file(directory / WEIGHTS_FILE)


def write_reward_model_metadata(directory: str | Path, **recorded: Any) -> dict[str, Any]:
    """Make the files `write_model_files` wrote into `directory` a rewardplane reward-model
    checkpoint made outside training (a converted model, a benchmark's): `rewardplane.json` with
    the objective, the head, the weights' size and SHA-256, and `recorded` (e.g. `score_position`,
    `plain_text`, `base_model`), written last. Returns the metadata."""
    from rewardplane.models.reward_model import RewardModel

    directory = Path(directory)
    meta = {
        "format_version": FORMAT_VERSION,
        "objective": OBJECTIVE,
        "role": "reward_model",
        "head_type": RewardModel.head_type,
        **recorded,
        "model_sha256": sha256_file(directory / WEIGHTS_FILE),
        "weight_files": file_digests(directory),
    }
    (directory / METADATA_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))
    return meta


def _to_hf_name(name: str, prefix: str) -> str:
    if name == "head.weight":
        return "score.weight"
    return prefix + name[len("backbone") :] if name.startswith("backbone.") else name


def from_hf_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint weights in transformers' seqcls naming (`<prefix>.*`, `score.weight`) back to
    rewardplane's (`backbone.*`, `head.weight`); other state dicts (DPO policies, older checkpoints)
    are returned unchanged."""
    if "score.weight" not in state or "head.weight" in state:
        return state
    prefixes = {k.split(".", 1)[0] for k in state if k != "score.weight"}
    if len(prefixes) != 1:
        return state
    (prefix,) = prefixes
    return {
        ("head.weight" if k == "score.weight" else "backbone" + k[len(prefix) :]): v for k, v in state.items()
    }


def load_backbone_config(path: Path) -> Any:
    """The backbone's config from a checkpoint's config.json (also when its model_type is masked)."""
    from transformers import AutoConfig

    data = json.loads((path / "config.json").read_text())
    key = next((k for k in (MASKED_MODEL_TYPE_KEY, legacy.MASKED_MODEL_TYPE_KEY) if k in data), None)
    if key is None:
        return AutoConfig.from_pretrained(path, local_files_only=True)
    model_type = data.pop(key)
    for key in ("model_type", "architectures", "transformers_version"):
        data.pop(key, None)
    return AutoConfig.for_model(model_type, **data)


def load_model_weights(model: nn.Module, directory: Path) -> None:
    """Load a checkpoint's unsharded weights (`model.safetensors`) on every rank (any wrapping).

    The file is checked against the recorded size and SHA-256 first (`verify_files`).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    directory = Path(directory)
    if is_checkpoint(directory):
        verify_files(directory, read_metadata(directory))
    options = StateDictOptions(full_state_dict=True)
    state = from_hf_names(load_safetensors(directory / WEIGHTS_FILE))
    set_model_state_dict(model, state, options=options)


def load_safetensors(file: Path) -> dict[str, torch.Tensor]:
    """`safetensors.torch.load_file`, with an unreadable file as a one-line `CheckpointError`."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise CheckpointError(f"{file}: missing", code="missing_weights") from None
        raise CheckpointError(f"{file}: cannot read safetensors ({exc})", code="bad_weights") from None


def load_rewardplane_model(path: str | Path, *, dtype: torch.dtype | None = None) -> tuple[nn.Module, dict]:
    """Rebuild `RewardModel` from config.json + model.safetensors and return it with its metadata."""
    from transformers import AutoModel

    from rewardplane.models.reward_model import RewardModel

    path = Path(path)
    meta = read_metadata(path)
    if meta.get("objective") != OBJECTIVE:
        raise CheckpointError(
            f"{path}: objective {meta.get('objective')!r} (role {meta.get('role')!r}) is not a reward model",
            code="wrong_objective",
        )
    if meta.get("head_type") != RewardModel.head_type:
        raise CheckpointError(f"{path}: unknown reward head {meta.get('head_type')!r}", code="wrong_head")
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"{path}: missing {WEIGHTS_FILE}", code="missing_weights")
    verify_files(path, meta)
    config = load_backbone_config(path)
    config._attn_implementation = resolve_attn_implementation(meta.get("attn_implementation"))
    model = RewardModel(AutoModel.from_config(config, dtype=torch.float32))
    state = from_hf_names(load_safetensors(weights))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not match the config (missing {missing[:3]}, unexpected {unexpected[:3]})",
            code="weights_mismatch",
        )
    if dtype is not None:
        cast_weights(model.backbone, dtype)
    return model, meta


def load_reward_model(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> tuple[nn.Module, Any, dict[str, Any]]:
    """(model in eval mode, tokenizer, metadata) for a rewardplane checkpoint or an HF seqcls dir.

    `dtype` casts the backbone only; rewardplane heads stay fp32.
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory", code="not_found")
    if is_checkpoint(path):
        model, meta = load_rewardplane_model(path, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        # checkpoints from before `score_position` was recorded read at the end-of-turn marker
        meta = {**meta, "score_position": meta.get("score_position") or END_OF_TURN}
        if meta["score_position"] == END_OF_TURN:
            model.read_at_end_of_turn(tokenizer)
    else:
        config = _is_seqcls_dir(path)
        if config is None:
            raise CheckpointError(
                f"{path}: neither a rewardplane checkpoint nor an HF *ForSequenceClassification model",
                code="not_reward_model",
            )
        num_labels = config.get("num_labels") or len(config.get("id2label") or {}) or 2
        if num_labels != 1:
            raise CheckpointError(
                f"{path}: num_labels={num_labels}, a reward model needs 1", code="num_labels"
            )
        hf = AutoModelForSequenceClassification.from_pretrained(
            path, local_files_only=True, dtype=dtype or torch.float32
        )
        model = HFSequenceClassifier(hf)
        weights = sorted(path.glob("*.safetensors"))
        meta = {
            "format_version": FORMAT_VERSION,
            "objective": OBJECTIVE,
            "role": "reward_model",
            "head_type": HFSequenceClassifier.head_type,
            "architecture": config["architectures"][0],
            "model_sha256": sha256_file(weights[0]) if len(weights) == 1 else None,
            "score_position": TEMPLATE_END,  # HF reads the last non-pad token
            # as TRL's RewardTrainer tokenises plain-text rows, unless a rewardplane export records
            # that its checkpoint was trained otherwise
            "plain_text": exported_plain_text(path) or TEXT_EOS,
        }
        if "training_data" in (record := export_record(path)):  # its checkpoint's training pairs
            meta["training_data"] = record["training_data"]
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model.to(device).eval()
    return model, tokenizer, meta
