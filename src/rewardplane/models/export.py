"""A rewardplane checkpoint as a standard Hugging Face model.

Reward models become `*ForSequenceClassification` (num_labels = 1) for the families whose
classifier is exactly rewardplane's: the base model plus a bias-free `score` Linear read at the
last non-pad token (Llama, Qwen2, Mistral, Gemma, GPT-2, ...). Families that pool differently
(BERT-style encoders pool the first token through a dense+tanh pooler and a biased
classifier) are refused with that reason rather than exported into a model that scores
differently. Every export is reloaded with plain transformers and must reproduce rewardplane's
scores within 1e-5 (fp32) before it is renamed into place. The config's pad / bos / eos ids are
the tokenizer's, and a model card (README.md) records provenance, hashes, the probe accuracy
with its bootstrap interval when the run evaluated that step, usage and the scoring convention
(`score_position`: `template_end`, the last token of `apply_chat_template`, as TRL and
RewardBench read it; `end_of_turn` for checkpoints trained before that was recorded).
`rewardplane_export.json` records the check and the convention, `plain_text` included, so
`rewardplane eval` and `rewardplane serve` tokenise plain-text inputs to the export as the
checkpoint was trained (`models.loading.exported_plain_text`).

Which exporter a checkpoint takes is its objective's: the objective registry
(`rewardplane.objectives.registry`, `export_hf`) names each objective's function here.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from rewardplane.core import legacy
from rewardplane.core.errors import RewardplaneError

TOLERANCE = 1e-5


class ExportError(RewardplaneError):
    code = "export_refused"


VERIFY_CONVERSATIONS = [
    # (prompt messages, chosen, rejected): multi-turn, with and without system prompts
    (
        [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name a fruit."},
            {"role": "assistant", "content": "kiwi."},
            {"role": "user", "content": "Another one?"},
        ],
        "plum.",
        "red.",
    ),
    ([{"role": "user", "content": "Name an animal."}], "otter and lynx.", "blue."),
    (
        [
            {"role": "user", "content": "Name a color."},
            {"role": "assistant", "content": "teal."},
            {"role": "user", "content": "And a fruit?"},
        ],
        "fig.",
        "wolf.",
    ),
    (
        [{"role": "system", "content": "Answer in lowercase."}, {"role": "user", "content": "A colour?"}],
        "green.",
        "pear.",
    ),
]


def _verification_pairs(tokenizer: Any, max_length: int, score_position: str):
    """Real template-rendered branches: synthetic rows plus multi-turn conversations with system prompts."""
    from rewardplane.data.normalize import normalize_row
    from rewardplane.data.reasons import Rejection
    from rewardplane.data.synth import generate_rows
    from rewardplane.data.tokenize import TokenizeSettings, tokenize_pair

    settings = TokenizeSettings(
        max_length=max_length,
        max_completion_length=max_length // 2,
        truncation="truncate",
        score_position=score_position,
    )
    rows = generate_rows(6, seed=7) + [
        {"prompt": prompt, "chosen": chosen, "rejected": rejected}
        for prompt, chosen, rejected in VERIFY_CONVERSATIONS
    ]
    pairs = []
    for row in rows:
        try:
            pairs.append(tokenize_pair(normalize_row(row), tokenizer, settings))
        except Rejection:  # a conversation longer than a tiny model's max_length
            continue
    return pairs


def special_token_ids(tokenizer: Any, pad: int) -> dict[str, int | None]:
    """The config's pad / bos / eos ids: exactly the tokenizer's (pad: the one the export pads with)."""
    return {
        "pad_token_id": pad,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }


def _as_seqcls(model: Any, token_ids: dict[str, int | None]) -> Any:
    """The reward model as transformers' `*ForSequenceClassification` of its family (num_labels 1,
    the tokenizer's special ids), weights copied; refused where that class reads scores otherwise."""
    import torch
    from transformers import AutoModelForSequenceClassification

    config = model.config.__class__.from_dict(model.config.to_dict())
    config.num_labels = 1
    for key, value in token_ids.items():
        setattr(config, key, value)
    try:
        seqcls = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    except ValueError as exc:
        raise ExportError(
            f"model family {config.model_type!r} has no *ForSequenceClassification in transformers"
        ) from exc
    head = getattr(seqcls, "score", None)
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        raise ExportError(
            f"{type(seqcls).__name__} does not read a bias-free linear head at the last token (it pools"
            " differently), so it cannot reproduce this reward model's scores; serve the rewardplane"
            " checkpoint instead (serve scorer kind `rm`)"
        )
    seqcls.base_model.load_state_dict(model.backbone.state_dict())
    with torch.no_grad():
        head.weight.copy_(model.head.weight)
    return seqcls.eval()


def export_reward_model(checkpoint: Path, out: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rewardplane.core.atomic import staged_dir
    from rewardplane.data.collate import collate
    from rewardplane.data.tokenize import END_OF_TURN, LEGACY_SETTINGS
    from rewardplane.models.loading import EXPORT_FILE, load_reward_model

    model, tokenizer, meta = load_reward_model(checkpoint)  # weight files verified first
    model.eval()
    position = meta["score_position"]
    pad = export_pad_token_id(tokenizer, meta)
    seqcls = _as_seqcls(model, special_token_ids(tokenizer, pad))

    pairs = _verification_pairs(tokenizer, int(meta.get("max_length") or 128), position)
    ends = {b.input_ids[b.score_index] for p in pairs for b in (p.chosen, p.rejected)}
    if pad in ends:
        raise ExportError(
            f"the pad token (id {pad}) is the token scores are read at; *ForSequenceClassification finds the"
            " last non-pad token and would skip it. Set data.pad_token to a token that is not the"
            " tokenizer's EOS (as TRL's RewardConfig.pad_token) and retrain"
        )
    with staged_dir(out) as tmp:
        seqcls.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if position == END_OF_TURN:
            # a checkpoint trained before score_position: HF reads the last token, so feed each
            # branch up to its end-of-turn marker (the model card says so)
            pairs = [replace(p, chosen=_truncate(p.chosen), rejected=_truncate(p.rejected)) for p in pairs]
        reloaded = AutoModelForSequenceClassification.from_pretrained(
            tmp, local_files_only=True, dtype=torch.float32
        )
        reloaded.eval()
        batch = collate(pairs, layout="right", pad_token_id=pad)
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
            "score_position": position,
            # read back by models.loading.exported_plain_text: eval and the serve text scorers
            # tokenise the export's plain-text inputs as the checkpoint was trained
            "plain_text": meta.get("plain_text", LEGACY_SETTINGS["plain_text"]),
            "special_token_ids": special_token_ids(tokenizer, pad),
        }
        if "training_data" in meta:  # the checkpoint's training pairs travel with it (data.overlap)
            shutil.copyfile(
                Path(checkpoint) / meta["training_data"]["file"], tmp / meta["training_data"]["file"]
            )
            report["training_data"] = meta["training_data"]
        (tmp / EXPORT_FILE).write_text(json.dumps(report, indent=2, sort_keys=True))
        (tmp / "README.md").write_text(model_card(checkpoint, meta, report, tokenizer))
        # tokenizer_config's pad token must be the one the config names
        check = AutoTokenizer.from_pretrained(tmp, local_files_only=True)
        if check.pad_token_id != pad:
            raise ExportError(f"exported tokenizer pads with {check.pad_token_id}, config says {pad}")
    return report


def export_pad_token_id(tokenizer: Any, meta: dict[str, Any]) -> int:
    """The tokenizer's pad id (set from `data.pad_token` during training); EOS if it has none."""
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.pad_token_id is None:
        raise ExportError("the tokenizer has neither a pad nor an EOS token; set data.pad_token and retrain")
    return int(tokenizer.pad_token_id)


def _run_summary(checkpoint: Path, step: Any) -> dict[str, Any] | None:
    """The run's evaluation at this checkpoint's step (RUN/eval/step-N/summary.json), if present."""
    if not isinstance(step, int):
        return None
    summary = checkpoint.parent.parent / "eval" / f"step-{step:07d}" / "summary.json"
    try:
        return json.loads(summary.read_text())
    except (OSError, ValueError):
        return None


def _probe_accuracy(checkpoint: Path, step: Any) -> tuple[str, str]:
    """(probe accuracy with its bootstrap interval, probe tokens sha256) of the run's evaluation
    at this step, as the model card states them."""
    summary = _run_summary(checkpoint, step)
    if not summary or summary.get("accuracy") is None:
        return "not recorded (no evaluation of this step next to the checkpoint)", "unknown"
    strict = (summary.get("bootstrap") or {}).get("strict") or {}
    interval = strict.get("ci_95")
    accuracy = f"{summary['accuracy']:.4f} on {summary.get('n_pairs')} probe pairs"
    if interval:
        accuracy += f" (95% paired-bootstrap interval [{interval[0]:.4f}, {interval[1]:.4f}])"
    return accuracy, summary.get("probe_sha256") or "unknown"


def _convention(position: str, meta: dict[str, Any]) -> str:
    """The model card's scoring convention: where the reward is read, how plain text is scored."""
    from rewardplane.data.tokenize import CHAT_TEMPLATE, END_OF_TURN, TEXT_EOS

    if position == END_OF_TURN:
        convention = (
            "`end_of_turn` (a checkpoint trained before rewardplane recorded `score_position`): the reward is"
            " read at the chat template's end-of-turn token. Cut `apply_chat_template` ids after that"
            " token (e.g. drop ChatML's trailing newline after `<|im_end|>`) before the forward."
        )
    else:
        convention = (
            "`template_end`: the reward is read at the last token of `apply_chat_template(messages)`"
            " without a generation prompt (for ChatML the newline after `<|im_end|>`), as TRL's"
            " RewardTrainer and RewardBench read it."
        )
    if meta.get("plain_text", CHAT_TEMPLATE) == TEXT_EOS:
        convention += (
            "\n\nPlain-text (non-conversational) inputs are scored as TRL's RewardTrainer tokenises"
            " them (`plain_text: text_eos`): `tok(prompt + response + tok.eos_token)`, no chat"
            " template, EOS appended only if the response does not already end with it; the reward is"
            " read at that EOS."
        )
    else:
        convention += (
            "\n\nThis checkpoint was trained before rewardplane tokenised plain-text rows as TRL does"
            " (`plain_text: chat_template`): score a plain-text prompt and response as the conversation"
            " `[{role: user, content: prompt}, {role: assistant, content: response}]`."
        )
    return convention


def _plain_usage(meta: dict[str, Any], ids: dict[str, Any]) -> str:
    """The model card's plain-text usage: TRL's standard format, or why this export cannot."""
    from rewardplane.data.tokenize import CHAT_TEMPLATE, TEXT_EOS

    plain_usage = (
        """
Plain text (TRL's standard format), without a chat template:

```python
text = "Name a fruit." + " kiwi."
if not text.endswith(tok.eos_token):
    text += tok.eos_token
with torch.no_grad():
    score = model(**tok(text, return_tensors="pt")).logits[0, 0].item()
```
"""
        if meta.get("plain_text", CHAT_TEMPLATE) == TEXT_EOS and ids["pad_token_id"] != ids["eos_token_id"]
        else ""
    )
    if meta.get("plain_text", CHAT_TEMPLATE) == TEXT_EOS and not plain_usage:
        # *ForSequenceClassification reads the last non-pad token: a final EOS equal to pad is skipped
        plain_usage = (
            "\nThis export pads with EOS, so `*ForSequenceClassification` would skip the EOS that plain"
            " text is scored at: score plain text with rewardplane (`rewardplane eval`, `rewardplane serve`),"
            " or retrain with `data.pad_token` set to another token.\n"
        )
    return plain_usage


def model_card(checkpoint: Path, meta: dict[str, Any], report: dict[str, Any], tokenizer: Any) -> str:
    """README.md of an exported reward model: provenance, hashes, probe accuracy, usage, convention."""
    base = meta.get("base_model") or {}
    base_name = base.get("path") or base.get("init_from") or base.get("random_init") or "unknown"
    accuracy, probe = _probe_accuracy(Path(checkpoint), meta.get("step"))
    convention = _convention(report["score_position"], meta)
    ids = report["special_token_ids"]
    plain_usage = _plain_usage(meta, ids)
    return f"""---
library_name: transformers
tags: [reward-model, rewardplane]
---

# Reward model exported by rewardplane

A `{report["architecture"]}` with `num_labels = 1`: the score is `logits[0, 0]`.

| | |
|---|---|
| base model | `{base_name}` (sha256 `{base.get("sha256")}`) |
| training step | {meta.get("step")} ({meta.get("pairs_consumed")} pairs) |
| training data (tokenised pairs) sha256 | `{legacy.train_pairs_sha256(meta)}` |
| probe tokens sha256 | `{probe}` |
| probe accuracy | {accuracy} |
| tokenizer sha256 / template sha256 | `{meta.get("tokenizer_sha256")}` / `{meta.get("template_sha256")}` |
| checkpoint weights sha256 | `{meta.get("model_sha256")}` |
| special tokens (config = tokenizer) | pad {ids["pad_token_id"]}, bos {ids["bos_token_id"]}, eos {ids["eos_token_id"]} |
| export check | {report["verified_sequences"]} sequences, max abs difference {report["max_abs_diff"]:.2e} vs the checkpoint (fp32) |

## Scoring convention

{convention}

## Usage

```python
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

tok = AutoTokenizer.from_pretrained("PATH")
model = AutoModelForSequenceClassification.from_pretrained("PATH", dtype=torch.float32).eval()
messages = [{{"role": "user", "content": "Name a fruit."}}, {{"role": "assistant", "content": "kiwi."}}]
ids = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt")
with torch.no_grad():
    score = model(**ids).logits[0, 0].item()
```
{plain_usage}"""


def _truncate(branch):
    end = branch.score_index + 1
    return replace(branch, input_ids=branch.input_ids[:end], loss_mask=branch.loss_mask[:end])


def export_dpo_policy(checkpoint: Path, out: Path) -> dict[str, Any]:
    """Write a DPO checkpoint's policy as a plain HF causal LM directory (`rewardplane export hf`).

    The weights are checked against the checkpoint's recorded SHA-256 first. The export is
    `save_pretrained` output plus the tokenizer, with none of the training state; it is reloaded
    with plain transformers and must give bit-identical logits before it is renamed into place.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rewardplane.core.atomic import staged_dir
    from rewardplane.models.loading import WEIGHTS_FILE, CheckpointError, read_metadata, verify_files

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
