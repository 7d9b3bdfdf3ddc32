"""A rewardkit checkpoint as a standard Hugging Face model.

Reward models become `*ForSequenceClassification` (num_labels = 1) for the families whose
classifier is exactly rewardkit's: the base model plus a bias-free `score` Linear read at the
last non-pad token (Llama, Qwen2, Mistral, Gemma, GPT-2, ...). Families that pool differently
(BERT-style encoders pool the first token through a dense+tanh pooler and a biased
classifier) are refused with that reason rather than exported into a model that scores
differently. Every export is reloaded with plain transformers and must reproduce rewardkit's
scores within 1e-5 (fp32) before it is renamed into place.

Dispatch is on the checkpoint's `objective`; other objectives (DPO policies) register their
own exporter in `EXPORTERS`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from rewardkit.core.errors import RewardkitError, UsageError

TOLERANCE = 1e-5


class ExportError(RewardkitError):
    code = "export_refused"


def _verification_pairs(tokenizer: Any, max_length: int):
    """Real template-rendered branches (ending at the end-of-turn token the score is read at)."""
    from rewardkit.data.normalize import normalize_row
    from rewardkit.data.synth import generate_rows
    from rewardkit.data.tokenize import TokenizeSettings, tokenize_pair

    settings = TokenizeSettings(
        max_length=max_length, max_completion_length=max_length // 2, truncation="truncate"
    )
    return [tokenize_pair(normalize_row(row), tokenizer, settings) for row in generate_rows(6, seed=7)]


def export_reward_model(checkpoint: Path, out: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rewardkit.core.atomic import staged_dir
    from rewardkit.data.collate import collate
    from rewardkit.models.loading import load_rewardkit_model

    model, meta = load_rewardkit_model(checkpoint)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    config = model.config.__class__.from_dict(model.config.to_dict())
    config.num_labels = 1
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    config.pad_token_id = pad
    family = config.model_type
    try:
        seqcls = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    except ValueError as exc:
        raise ExportError(
            f"model family {family!r} has no *ForSequenceClassification in transformers"
        ) from exc
    head = getattr(seqcls, "score", None)
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        raise ExportError(
            f"{type(seqcls).__name__} does not read a bias-free linear head at the last token (it pools"
            " differently), so it cannot reproduce this reward model's scores; serve the rewardkit"
            " checkpoint instead (serve scorer kind `rm`)"
        )
    seqcls.base_model.load_state_dict(model.backbone.state_dict())
    with torch.no_grad():
        head.weight.copy_(model.head.weight)
    seqcls.eval()

    pairs = _verification_pairs(tokenizer, int(meta.get("max_length") or 128))
    ends = {b.input_ids[b.score_index] for p in pairs for b in (p.chosen, p.rejected)}
    if pad in ends:
        raise ExportError(
            f"the pad token (id {pad}) is the token scores are read at; *ForSequenceClassification finds the"
            " last non-pad token and would skip it. Give the tokenizer a distinct pad token before training"
        )
    with staged_dir(out) as tmp:
        seqcls.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        reloaded = AutoModelForSequenceClassification.from_pretrained(
            tmp, local_files_only=True, dtype=torch.float32
        )
        reloaded.eval()
        # HF scores the last non-pad token, so feed each branch up to its score index.
        cut = [replace(p, chosen=_truncate(p.chosen), rejected=_truncate(p.rejected)) for p in pairs]
        batch = collate(cut, layout="right", pad_token_id=pad)
        with torch.no_grad():
            ours = model(batch)
            theirs = reloaded(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, 0]
        diff = float((ours - theirs).abs().max())
        if diff > TOLERANCE:
            raise ExportError(f"exported model disagrees with the checkpoint by {diff:.2e} (> {TOLERANCE})")
        report = {
            "checkpoint": str(checkpoint),
            "out": str(out),
            "architecture": type(seqcls).__name__,
            "max_abs_diff": diff,
            "verified_sequences": len(ours),
            "source_model_sha256": meta.get("model_sha256"),
        }
        (tmp / "rewardkit_export.json").write_text(json.dumps(report, indent=2, sort_keys=True))
    return report


def _truncate(branch):
    end = branch.score_index + 1
    return replace(branch, input_ids=branch.input_ids[:end], loss_mask=branch.loss_mask[:end])


def export_dpo_policy(checkpoint: Path, out: Path) -> dict[str, Any]:
    """Write a DPO checkpoint's policy as a plain HF causal LM directory (`rewardkit export hf`).

    The weights are checked against the checkpoint's recorded SHA-256 first. The export is
    `save_pretrained` output plus the tokenizer, with none of the training state; it is reloaded
    with plain transformers and must give bit-identical logits before it is renamed into place.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rewardkit.core.atomic import staged_dir
    from rewardkit.models.loading import WEIGHTS_FILE, CheckpointError, read_metadata, verify_files

    checkpoint, out = Path(checkpoint), Path(out)
    meta = read_metadata(checkpoint)
    if meta.get("objective") != "dpo":
        raise CheckpointError(
            f"{checkpoint}: objective {meta.get('objective')!r} is not a DPO policy", code="wrong_objective"
        )
    if not (checkpoint / WEIGHTS_FILE).is_file():
        raise CheckpointError(f"{checkpoint / WEIGHTS_FILE}: missing", code="missing_weights")
    verify_files(checkpoint, meta)
    load = {"local_files_only": True, "trust_remote_code": False, "dtype": torch.float32}
    model = AutoModelForCausalLM.from_pretrained(checkpoint, **load).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    probe = torch.arange(min(32, model.config.vocab_size))[None] % model.config.vocab_size
    with staged_dir(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        reloaded = AutoModelForCausalLM.from_pretrained(tmp, **load).eval()
        with torch.no_grad():
            diff = float((model(probe).logits - reloaded(probe).logits).abs().max())
        if diff != 0.0:
            raise ExportError(f"exported causal LM disagrees with the checkpoint by {diff:.2e}")
    return {
        "checkpoint": str(checkpoint),
        "out": str(out),
        "architecture": type(model).__name__,
        "max_abs_diff": diff,
        "source_model_sha256": meta.get("model_sha256"),
    }


EXPORTERS: dict[str, Callable[[Path, Path], dict[str, Any]]] = {
    "reward_model": export_reward_model,
    "dpo": export_dpo_policy,
}


def export_hf(checkpoint: str | Path, out: str | Path) -> dict[str, Any]:
    from rewardkit.models.loading import read_metadata

    checkpoint, out = Path(checkpoint), Path(out)
    if out.exists():
        raise UsageError(f"{out} already exists; choose a new output directory")
    meta = read_metadata(checkpoint)
    exporter = EXPORTERS.get(meta.get("objective"))
    if exporter is None:
        raise ExportError(
            f"no HF exporter for objective {meta.get('objective')!r}; known: {', '.join(sorted(EXPORTERS))}"
        )
    return exporter(checkpoint, out)
