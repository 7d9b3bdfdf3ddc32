"""Evaluation artifacts: `pairs.jsonl` (one row per probe pair) and `summary.json`.

Training writes them under `RUN/eval/step-NNNNNNN/` at step 0, every N steps and at the
end; `rewardplane eval` writes them to `--out`. Every row of `pairs.jsonl` carries the probe
hash, so a copied pairs file is still self-describing and `rewardplane compare` can refuse
files from different probes without needing the summary next to it. `summary.json` is
written last and records the SHA-256 of `pairs.jsonl`, so a summary always describes the
complete pairs file next to it (both writes are atomic).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rewardplane.core import atomic, legacy
from rewardplane.core.errors import RewardplaneError, UsageError
from rewardplane.core.hashing import sha256_bytes
from rewardplane.data.overlap import Overlap
from rewardplane.eval import bootstrap, metrics

PAIRS_FILE = "pairs.jsonl"
SUMMARY_FILE = "summary.json"
SUMMARY_SCHEMA = "rewardplane.eval.summary/1"
_STEP_DIR = re.compile(r"^step-(\d{7,})$")
_ROW_FIELDS: dict[str, tuple[type, ...]] = {
    "pair_id": (str,),
    "chosen_score": (int, float),
    "rejected_score": (int, float),
    "margin": (int, float),
    "pair_loss": (int, float),
    "correct": (bool,),
    "tie": (bool,),
    "subset": (str, type(None)),
    "probe_sha256": (str,),
}


def eval_step_dir(run_dir: str | Path, step: int) -> Path:
    """`RUN/eval/step-NNNNNNN`: zero-padded so directory order is step order."""
    return Path(run_dir) / "eval" / f"step-{step:07d}"


def eval_steps(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, directory) for every evaluation under RUN/eval that has a summary, by step."""
    root = Path(run_dir) / "eval"
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / SUMMARY_FILE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def _pair_rows(
    pair_ids: Sequence[str],
    margin: np.ndarray,
    chosen: np.ndarray,
    rejected: np.ndarray,
    loss: np.ndarray,
    subsets: Sequence[str | None],
    probe_sha256: str,
    completion_tokens: tuple[Sequence[int], Sequence[int]] | None = None,
    in_training: Sequence[bool] | None = None,
) -> bytes:
    correct = metrics.strict_correct(margin)
    tie = metrics.ties(margin)
    lines = []
    for i, pair_id in enumerate(pair_ids):
        lengths = (
            {"chosen_tokens": int(completion_tokens[0][i]), "rejected_tokens": int(completion_tokens[1][i])}
            if completion_tokens is not None
            else {}
        )
        row = {
            "pair_id": pair_id,
            "chosen_score": float(chosen[i]),
            "rejected_score": float(rejected[i]),
            "margin": float(margin[i]),
            "pair_loss": float(loss[i]),
            "correct": bool(correct[i]),
            "tie": bool(tie[i]),
            "subset": subsets[i],
            "probe_sha256": probe_sha256,
            **lengths,
        }
        if in_training is not None:
            row["in_training"] = bool(in_training[i])
        lines.append(json.dumps(row, allow_nan=False, ensure_ascii=False))
    return ("\n".join(lines) + "\n").encode("utf-8")


def _check_pairs(pair_ids: list[str], subsets: list[str | None], n_scores: int) -> None:
    """One unique string id and a subset (or None) per scored pair, at least one pair."""
    if not (len(pair_ids) == len(subsets) == n_scores) or n_scores == 0:
        raise ValueError(
            f"need one pair_id, subset and score pair per probe pair; got {len(pair_ids)} ids, "
            f"{len(subsets)} subsets, {n_scores} score pairs"
        )
    if not all(isinstance(p, str) for p in pair_ids) or not all(
        s is None or isinstance(s, str) for s in subsets
    ):
        raise ValueError("pair_ids must be strings and subsets strings or None")
    if len(set(pair_ids)) != len(pair_ids):
        raise ValueError("pair_ids are not unique")


def _accuracy_intervals(margin: np.ndarray, seed: int, replicates: int) -> dict[str, Any]:
    """The paired bootstrap of strict and tie-aware accuracy (one seed: the same resamples)."""
    return {
        "strict": bootstrap.bootstrap_mean(
            metrics.strict_correct(margin).astype(np.float64),
            statistic="accuracy (strict: margin > 0)",
            seed=seed,
            replicates=replicates,
        ),
        "tie_aware": bootstrap.bootstrap_mean(
            metrics.tie_aware_credit(margin),
            statistic="accuracy_tie_aware (1 / 0.5 tie / 0)",
            seed=seed,
            replicates=replicates,
        ),
    }


def write_eval_artifacts(
    out_dir: str | Path,
    *,
    pair_ids: Sequence[str],
    chosen_scores: Sequence[float] | np.ndarray,
    rejected_scores: Sequence[float] | np.ndarray,
    subsets: Sequence[str | None],
    probe_sha256: str,
    objective: str,
    model_identity: dict[str, Any],
    batch_plan: dict[str, Any],
    seed: int = bootstrap.DEFAULT_SEED,
    replicates: int = bootstrap.DEFAULT_REPLICATES,
    pair_losses: Sequence[float] | np.ndarray | None = None,
    completion_tokens: tuple[Sequence[int], Sequence[int]] | None = None,
    extra: dict[str, Any] | None = None,
    overlap: Overlap | None = None,
) -> dict[str, Any]:
    """Score → artifacts: write pairs.jsonl then summary.json into out_dir; return the summary.

    `completion_tokens` (chosen, rejected token counts per pair) adds `chosen_tokens` /
    `rejected_tokens` to each row, for the report's length-bias check; `extra` adds summary
    keys (`rewardplane eval` records `data` and `throughput`). Training passes neither.
    `overlap` (which pairs the model was trained on, `rewardplane.data.overlap`) adds
    `train_overlap` to the summary and, when it was checked, `in_training` to each row.

    Scores are in probe order. NaN/inf scores or losses are refused (ValueError) rather than
    written: a failed forward pass must never turn into a measured preference.
    `pair_losses` defaults to −log σ(margin) (Bradley–Terry; equals sigmoid DPO on implicit
    rewards with β folded in).
    """
    pair_ids = list(pair_ids)
    subsets = list(subsets)
    margin = metrics.margins(chosen_scores, rejected_scores)
    chosen = np.asarray(chosen_scores, dtype=np.float64)
    rejected = np.asarray(rejected_scores, dtype=np.float64)
    _check_pairs(pair_ids, subsets, margin.size)
    if pair_losses is None:
        loss = metrics.bradley_terry_loss(margin)
    else:
        loss = metrics.finite_array(pair_losses, "pair losses")
        if loss.shape != margin.shape:
            raise ValueError(f"{loss.size} pair losses for {margin.size} pairs")

    if completion_tokens is not None and not (
        len(completion_tokens[0]) == len(completion_tokens[1]) == margin.size
    ):
        raise ValueError("need chosen and rejected token counts for every pair")
    flags = overlap.in_training if overlap is not None else None
    if flags is not None and len(flags) != margin.size:
        raise ValueError(f"{len(flags)} overlap flags for {margin.size} pairs")
    pairs_bytes = _pair_rows(
        pair_ids, margin, chosen, rejected, loss, subsets, probe_sha256, completion_tokens, flags
    )
    summary: dict[str, Any] = {
        "schema": SUMMARY_SCHEMA,
        "objective": objective,
        "model": model_identity,
        "probe_sha256": probe_sha256,
        "batch_plan": batch_plan,
        **metrics.summarize(margin, loss),
        "tie_tolerance": metrics.TIE_TOLERANCE,
        "subsets": metrics.per_subset(margin, loss, subsets),
        "n_without_subset": sum(1 for s in subsets if s is None),
        "bootstrap": _accuracy_intervals(margin, seed, replicates),
        **(extra or {}),
        **({"train_overlap": overlap.summary()} if overlap is not None else {}),
        "pairs_file": PAIRS_FILE,
        "pairs_sha256": sha256_bytes(pairs_bytes),
    }
    out = Path(out_dir)
    atomic.write_bytes(out / PAIRS_FILE, pairs_bytes)
    atomic.write_json(out / SUMMARY_FILE, summary)
    return summary


def load_summary(path: str | Path) -> dict[str, Any]:
    """Read a summary.json (or the summary.json inside a directory)."""
    path = Path(path)
    if path.is_dir():
        path = path / SUMMARY_FILE
    with open(path, encoding="utf-8") as handle:
        summary = json.load(handle)
    if summary.get("schema") not in (SUMMARY_SCHEMA, legacy.EVAL_SUMMARY_SCHEMA):
        raise UsageError(f"{path}: not a rewardplane evaluation summary", code="bad_summary")
    return summary


def assert_same_contract(step0_summary: dict[str, Any], final_summary: dict[str, Any]) -> None:
    """Refuse a final evaluation that did not use step 0's frozen probe and batch plan.

    Comparing step-0 and final accuracy is only meaningful on the same pairs, tokenised the
    same way, scored in the same batches; anything else is a different experiment.
    """
    differences = [
        f"{key}: step 0 {step0_summary.get(key)!r} vs final {final_summary.get(key)!r}"
        for key in ("probe_sha256", "n_pairs", "batch_plan")
        if step0_summary.get(key) != final_summary.get(key)
    ]
    if differences:
        raise RewardplaneError(
            "final evaluation does not match the step-0 contract: " + "; ".join(differences),
            code="eval_contract_mismatch",
        )


def _bad_row(path: Path, line_no: int, reason: str) -> UsageError:
    return UsageError(f"{path}:{line_no}: {reason}", code="bad_pairs_file")


def iter_jsonl(path: Path, *, code: str) -> Iterator[tuple[int, Any]]:
    """(1-based line number, decoded value) for each non-blank line; a broken line is a coded UsageError."""
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{path}:{line_no}: not JSON ({exc.msg})", code=code) from None


def _check_row(path: Path, line_no: int, row: Any) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise _bad_row(path, line_no, "row is not a JSON object")
    for name, types in _ROW_FIELDS.items():
        value = row.get(name)
        if name not in row or not isinstance(value, types) or (bool in types) != isinstance(value, bool):
            raise _bad_row(path, line_no, f"field {name!r} missing or not {types[0].__name__}")
        if isinstance(value, float) and not math.isfinite(value):
            raise _bad_row(path, line_no, f"field {name!r} is not finite")
    margin = row["margin"]
    if margin != row["chosen_score"] - row["rejected_score"]:
        raise _bad_row(path, line_no, "margin is not chosen_score - rejected_score")
    if row["correct"] != (margin > 0) or row["tie"] != (abs(margin) <= metrics.TIE_TOLERANCE):
        raise _bad_row(path, line_no, "correct/tie do not follow from the margin")
    return row


def read_pairs(path: str | Path) -> list[dict[str, Any]]:
    """Read and validate a pairs.jsonl: field types, finite numbers, margin/correct/tie consistent
    with the scores, unique ids, one probe hash. A hand-edited row is refused, not compared."""
    path = Path(path)
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for line_no, value in iter_jsonl(path, code="bad_pairs_file"):
        row = _check_row(path, line_no, value)
        if row["pair_id"] in seen:
            raise _bad_row(path, line_no, f"duplicate pair_id {row['pair_id']!r}")
        if rows and row["probe_sha256"] != rows[0]["probe_sha256"]:
            raise _bad_row(path, line_no, "probe_sha256 differs from the first row")
        seen.add(row["pair_id"])
        rows.append(row)
    if not rows:
        raise UsageError(f"{path}: no pairs", code="bad_pairs_file")
    return rows
