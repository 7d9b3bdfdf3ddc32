"""`prepare`: a reproducible train/eval split of the valid rows, with a manifest.

The split does not depend on input order: each valid pair is ranked by
`sha256(seed_key + ":" + pair_id)` and the first `eval_size` in that order form the eval set
(written in that order), the rest the train set (written in input order, so the pass stays
streaming; training shuffles with its own seed anyway). Only the eval candidates are held in
memory (a bounded heap); train rows are spooled to a file.

`split_by="prompt"` or `"first_turn"` keeps every pair of one group on one side, so no held-out
pair shares its prompt (or its conversation's opening user turn) with a training pair: pairs
are ranked by their group's rank first, and the group at the boundary goes whole to eval (which
then holds a few more than `eval_size` pairs; the manifest counts what was written).

The manifest holds no timestamps or absolute paths, so the same input and settings give a
byte-identical `manifest.json`.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from pathlib import Path
from typing import Any

from rewardplane import __version__
from rewardplane.core.atomic import staged_dir, write_json
from rewardplane.core.errors import UsageError
from rewardplane.core.hashing import canonical_json, sha256_file
from rewardplane.data.pipeline import Summary, iter_validated
from rewardplane.data.reader import detect_format, input_name, input_sha256
from rewardplane.data.reasons import Rejection
from rewardplane.data.records import PreferencePair
from rewardplane.data.tokenize import TokenizeSettings, template_sha256, tokenizer_sha256

MANIFEST_FORMAT = "rewardplane.manifest/v1"
OUTPUTS = ("train.jsonl", "eval.jsonl", "rejects.jsonl")
SPLIT_BY = ("pair", "prompt", "first_turn")
"""What a split keeps whole: each pair alone, every pair of one prompt, or every pair whose
conversation opens with the same user turn (HH-RLHF's branches share openings, not prompts)."""


def split_rank(seed_key: str, pair_id: str) -> str:
    """The order that decides the split: hex SHA-256 of `KEY:pair_id`."""
    return hashlib.sha256(f"{seed_key}:{pair_id}".encode()).hexdigest()


def group_key(pair: PreferencePair, split_by: str) -> str:
    """The key a `split_by` group shares ("" for `pair`, where every pair is its own group)."""
    if split_by == "pair":
        return ""
    if split_by == "first_turn":
        first_user = next((m["content"] for m in pair.prompt if m.get("role") == "user"), None)
        if first_user is not None:
            return canonical_json(["first_turn", first_user]).decode()
    return canonical_json(["prompt", pair.prompt]).decode()


def _rank(seed_key: str, pair: PreferencePair, split_by: str) -> str:
    own = split_rank(seed_key, pair.pair_id)
    return own if split_by == "pair" else split_rank(seed_key, group_key(pair, split_by)) + own


def prepare(
    source: str | Path,
    out: str | Path,
    *,
    eval_size: int,
    seed_key: str,
    tokenizer=None,
    tokenizer_name: str | None = None,
    settings: TokenizeSettings | None = None,
    progress=None,
    split_by: str = "pair",
) -> dict[str, Any]:
    """Write train/eval/rejects JSONL and manifest.json into `out` (atomically); return the manifest."""
    if eval_size < 0:
        raise UsageError("--eval-size must be >= 0")
    if not seed_key:
        raise UsageError("--seed-key must not be empty")
    if split_by not in SPLIT_BY:
        raise UsageError(f"--split-by {split_by!r}: one of {', '.join(SPLIT_BY)}")
    settings = settings or TokenizeSettings()
    summary = Summary()
    heap: list[tuple[str, int, bytes]] = []  # (inverted rank, valid index, line)
    group_ranks: list[str] = []  # each valid pair's group rank (split_by != "pair" only)
    with staged_dir(out) as tmp:
        spool_path = tmp / ".train.spool"
        with open(tmp / "rejects.jsonl", "wb") as rejects, open(spool_path, "wb") as spool:
            valid_index = 0
            for item in iter_validated(source, tokenizer, settings):
                summary.add(item)
                if progress is not None:
                    progress.update(1)
                if isinstance(item, Rejection):
                    rejects.write(canonical_json(item.to_json()) + b"\n")
                    continue
                pair, _ = item
                line = canonical_json(pair.to_json()) + b"\n"
                spool.write(line)
                # keep the eval_size smallest ranks: a max-heap on rank (inverted hex digits)
                rank = _rank(seed_key, pair, split_by)
                if split_by != "pair":
                    group_ranks.append(rank[:64])
                entry = (_invert(rank), valid_index, line)
                if len(heap) < eval_size:
                    heapq.heappush(heap, entry)
                elif eval_size and entry > heap[0]:
                    heapq.heapreplace(heap, entry)
                valid_index += 1
        if eval_size > summary.valid:
            raise UsageError(f"--eval-size {eval_size} exceeds the {summary.valid} valid rows")
        n_eval = _write_split(tmp, spool_path, sorted(heap, reverse=True), group_ranks)
        split = {"eval_size": eval_size, "seed_key": seed_key, "rank": "sha256(seed_key + ':' + pair_id)"}
        if split_by != "pair":
            split |= {"by": split_by, "group_rank": _GROUP_RANK}
        manifest = _manifest(source, tmp, split, n_eval, summary, tokenizer, tokenizer_name, settings)
        write_json(tmp / "manifest.json", manifest)
    return manifest


def _write_split(tmp: Path, spool_path: Path, eval_entries: list, group_ranks: list[str]) -> int:
    """eval.jsonl (the heap's pairs in rank order, then the rest of the boundary group) and
    train.jsonl (every other spooled pair, in input order); returns how many went to eval."""
    eval_indices = {index for _, index, _ in eval_entries}
    boundary = _invert(eval_entries[-1][0])[:64] if eval_entries and group_ranks else None
    n_eval = len(eval_entries)
    with open(tmp / "eval.jsonl", "wb") as handle:
        for _, _, line in eval_entries:
            handle.write(line)
        with open(spool_path, "rb") as spool, open(tmp / "train.jsonl", "wb") as train:
            for index, line in enumerate(spool):
                if index in eval_indices:
                    continue
                if boundary is not None and group_ranks[index] == boundary:
                    handle.write(line)  # the boundary group goes whole to eval
                    n_eval += 1
                else:
                    train.write(line)
    spool_path.unlink()
    return n_eval


def _manifest(
    source: str | Path,
    tmp: Path,
    split: dict[str, Any],
    n_eval: int,
    summary: Summary,
    tokenizer,
    tokenizer_name: str | None,
    settings: TokenizeSettings,
) -> dict[str, Any]:
    """manifest.json's content: input, split rule, tokenizer, counts, and the written files' hashes."""
    return {
        "format": MANIFEST_FORMAT,
        "rewardplane_version": __version__,
        "input": {
            "name": input_name(source),
            "format": detect_format(source),
            "sha256": input_sha256(source),
        },
        "split": split,
        "tokenizer": None
        if tokenizer is None
        else {
            "name": tokenizer_name,
            "tokenizer_sha256": tokenizer_sha256(tokenizer),
            "template_sha256": template_sha256(tokenizer),
            "settings": settings.to_json(),
        },
        "counts": {
            "rows": summary.rows,
            "valid": summary.valid,
            "rejected": summary.rejected,
            "train": summary.valid - n_eval,
            "eval": n_eval,
        },
        "rejections": dict(summary.rejections),
        "outputs": {name: {"sha256": sha256_file(tmp / name)} for name in OUTPUTS},
    }


_GROUP_RANK = "sha256(seed_key + ':' + group key), then the pair's own rank; the boundary group whole"

_INVERT = str.maketrans("0123456789abcdef", "fedcba9876543210")


def _invert(hex_digest: str) -> str:
    """A string that sorts in the reverse order of `hex_digest` (turns heapq's min-heap into a max-heap)."""
    return hex_digest.translate(_INVERT)


def prepared_eval(path: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """(eval file, manifest) when `path` is a folder `prepare` wrote, or the `eval.jsonl` of one
    as it wrote it (its SHA-256 still the recorded one); else None.

    So `rewardplane data freeze-probe data/` freezes the eval split with the tokenizer and
    settings it was validated with, instead of the defaults (a probe frozen at 1024 tokens
    refuses a run that trains at 128).
    """
    path = Path(path)
    folder, eval_file = (path, path / "eval.jsonl") if path.is_dir() else (path.parent, path)
    manifest = _read_manifest(folder)
    if manifest is None:
        return None
    recorded = (manifest.get("outputs") or {}).get(eval_file.name)
    if not eval_file.is_file() or not recorded:
        return None
    if not path.is_dir() and recorded.get("sha256") != sha256_file(eval_file):
        return None  # edited since: its recorded settings no longer describe it
    return eval_file, manifest


def _read_manifest(folder: Path) -> dict[str, Any] | None:
    """The `manifest.json` of a folder `prepare` wrote, or None."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        return None
    return manifest


def read_prepared(folder: str | Path, key: str = "data.prepared") -> tuple[dict[str, Any], str]:
    """(manifest, SHA-256 of manifest.json) of a folder `prepare` wrote, after checking that its
    train and eval files are the ones it recorded: training reads them as prepared or not at all.
    `key` names the setting in the one-line errors."""
    folder = Path(folder)
    manifest = _read_manifest(folder)
    if manifest is None:
        raise UsageError(
            f"{key}={folder}: no {MANIFEST_FORMAT} manifest.json (a folder written by `rewardplane data prepare`)",
            code="not_prepared",
        )
    for name in ("train.jsonl", "eval.jsonl"):
        recorded = ((manifest.get("outputs") or {}).get(name) or {}).get("sha256")
        file = folder / name
        actual = sha256_file(file) if file.is_file() else None
        if actual != recorded:
            now = "missing" if actual is None else f"now {actual[:12]}"
            raise UsageError(
                f"{key}={folder}: {name} is not the file `rewardplane data prepare` wrote (recorded sha256"
                f" {str(recorded)[:12]}, {now}); prepare the folder again",
                code="prepared_changed",
            )
    return manifest, sha256_file(folder / "manifest.json")
