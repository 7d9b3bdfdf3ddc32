"""The probe contract: exactly which tokenised pairs an evaluation was frozen on.

`freeze_probe` records the pair ids in order, their count, one SHA-256 over the canonical
token ids, loss masks and score indices of every pair (plus a short per-pair hash so a
mismatch can be located), the tokenizer and chat-template hashes and the tokenisation
settings. `check_probe` refuses data that differs in any of these, saying what differs.

Two hashes name a probe. `tokens_sha256` covers the tokens scored, which is what makes two
evaluations the same measurement (evaluation artifacts carry it as their `probe_sha256`).
`contract_sha256` covers the whole contract: the tokens hash, the tokenizer and template hashes
and the settings. Two probes of the same short pairs frozen with different length limits score
the same tokens but are different contracts (the same data under the other limits would be
rejected or cut differently), so they share `tokens_sha256` and differ in `contract_sha256`.
Probes written before `contract_sha256` existed have none and are read as before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rewardplane.core import legacy
from rewardplane.core.errors import UsageError
from rewardplane.core.hashing import canonical_json, sha256_json
from rewardplane.data.pipeline import tokenize_source
from rewardplane.data.reasons import Rejection
from rewardplane.data.records import TokenizedBranch, TokenizedPair
from rewardplane.data.tokenize import (
    TokenizeSettings,
    recorded_settings,
    template_sha256,
    tokenizer_sha256,
)

PROBE_FORMAT = "rewardplane.probe/v1"
_PAIR_HASH_CHARS = 16
CONTRACT_KEYS = ("tokens_sha256", "tokenizer_sha256", "template_sha256", "settings")
# the `rewardplane data freeze-probe` option of each tokenisation setting, for the fix a mismatch names
SETTING_OPTIONS = {
    "max_length": "--max-length",
    "max_completion_length": "--max-completion-length",
    "truncation": "--truncation",
    "plain_text": "--plain-text",
}


class ProbeMismatch(UsageError):
    """The data, tokenizer or settings are not the ones the probe was frozen with."""

    code = "probe_mismatch"


def pair_record(pair: TokenizedPair) -> dict[str, Any]:
    """The canonical content of one tokenised pair that the probe hash covers."""

    def branch(b: TokenizedBranch) -> dict[str, Any]:
        return {"input_ids": list(b.input_ids), "loss_mask": list(b.loss_mask), "score_index": b.score_index}

    return {"pair_id": pair.pair_id, "chosen": branch(pair.chosen), "rejected": branch(pair.rejected)}


def _digest(pairs: Iterable[TokenizedPair]) -> tuple[list[str], list[str], str]:
    ids: list[str] = []
    pair_hashes: list[str] = []
    total = hashlib.sha256()
    for pair in pairs:
        line = canonical_json(pair_record(pair)) + b"\n"
        total.update(line)
        ids.append(pair.pair_id)
        pair_hashes.append(hashlib.sha256(line).hexdigest()[:_PAIR_HASH_CHARS])
    return ids, pair_hashes, total.hexdigest()


def contract_sha256(probe: dict[str, Any]) -> str:
    """SHA-256 of the probe's contract: its token hash, tokenizer and template hashes and settings."""
    return sha256_json({key: probe[key] for key in CONTRACT_KEYS})


def freeze_probe(
    tokenized_pairs: Iterable[TokenizedPair], tokenizer, settings: TokenizeSettings | None = None
) -> dict[str, Any]:
    """The probe document (JSON-serialisable) for these pairs, in this order."""
    settings = settings or TokenizeSettings()
    ids, pair_hashes, tokens_sha256 = _digest(tokenized_pairs)
    probe = {
        "format": PROBE_FORMAT,
        "count": len(ids),
        "pair_ids": ids,
        "pair_sha256_prefixes": pair_hashes,
        "tokens_sha256": tokens_sha256,
        "tokenizer_sha256": tokenizer_sha256(tokenizer),
        "template_sha256": template_sha256(tokenizer),
        "settings": settings.to_json(),
    }
    probe["contract_sha256"] = contract_sha256(probe)
    return probe


def settings_fix(frozen: dict[str, Any], given: dict[str, Any], differ: list[str]) -> str:
    """The two ways out of a settings mismatch: refreeze the probe with the data's settings, or
    tokenise the data with the probe's (training's `data.*` keys)."""
    options = " ".join(f"{SETTING_OPTIONS[key]} {given[key]}" for key in differ if key in SETTING_OPTIONS)
    keys = " ".join(f"data.{key}={frozen.get(key)}" for key in differ)
    refreeze = f"refreeze the probe with `rewardplane data freeze-probe EVAL {options} --out PROBE`"
    return f"{refreeze} or train with the probe's settings ({keys})" if options else f"train with {keys}"


def freeze_probe_file(
    path: str | Path, tokenizer, settings: TokenizeSettings | None = None
) -> dict[str, Any]:
    """The probe of an evaluation file, read through the data pipeline. A probe is frozen from
    clean data only: the first rejected row refuses it, saying which row and why."""
    try:
        pairs = tokenize_source(path, tokenizer, settings, strict=True)
    except Rejection as item:
        raise UsageError(
            f"{path}: row {item.source_index} rejected ({item.reason}: {item.message}); "
            "a probe is frozen from clean data (run `rewardplane data validate`)"
        ) from None
    return freeze_probe(pairs, tokenizer, settings)


def check_tokenisation(
    recorded: dict[str, Any],
    tokenizer=None,
    settings: TokenizeSettings | None = None,
    *,
    labels: tuple[str, str] = ("probe", "data"),
    fix: Callable[[dict[str, Any], dict[str, Any], list[str]], str] = settings_fix,
    error: type[UsageError] = ProbeMismatch,
) -> None:
    """Raise `error` unless the tokenizer and settings (each when given) are the ones `recorded`
    (a probe, or a prepared folder's manifest `tokenizer` record: the same keys) names; `labels`
    name the two sides in the one-line message, `fix` says how to make them agree."""
    mine, yours = labels
    if tokenizer is not None:
        for key, actual in (
            ("tokenizer_sha256", tokenizer_sha256(tokenizer)),
            ("template_sha256", template_sha256(tokenizer)),
        ):
            if recorded[key] != actual:
                raise error(f"{key} differs: {mine} {recorded[key][:12]}, {yours} {actual[:12]}")
    if settings is not None:
        # a record older than a settings key was written with that key's legacy value
        frozen, given = recorded_settings(recorded["settings"]), settings.to_json()
        # in the settings' own order (max_length before max_completion_length), as the options read
        differ = [key for key in {**given, **frozen} if frozen.get(key) != given.get(key)]
        if differ:
            raise error(
                "tokenisation settings differ: "
                + ", ".join(f"{key} {mine} {frozen.get(key)!r}, {yours} {given.get(key)!r}" for key in differ)
                + f"; {fix(frozen, given, differ)}"
            )


def check_probe(
    probe: dict[str, Any],
    tokenized_pairs: Iterable[TokenizedPair],
    *,
    tokenizer=None,
    settings: TokenizeSettings | None = None,
) -> None:
    """Raise `ProbeMismatch` unless the pairs (and tokenizer/settings, when given) match the probe."""
    if probe.get("format") not in (PROBE_FORMAT, legacy.PROBE_FORMAT):
        raise ProbeMismatch(f"not a {PROBE_FORMAT} document (format={probe.get('format')!r})")
    check_tokenisation(probe, tokenizer, settings)
    ids, pair_hashes, tokens_sha256 = _digest(tokenized_pairs)
    if len(ids) != probe["count"]:
        raise ProbeMismatch(f"count differs: probe has {probe['count']} pairs, data has {len(ids)}")
    for position, (expected, actual) in enumerate(zip(probe["pair_ids"], ids, strict=True)):
        if expected != actual:
            raise ProbeMismatch(
                f"pair id differs at position {position}: probe {expected!r}, data {actual!r}"
            )
    for position, (expected, actual) in enumerate(
        zip(probe["pair_sha256_prefixes"], pair_hashes, strict=True)
    ):
        if expected != actual:
            raise ProbeMismatch(
                f"tokens differ for pair {ids[position]!r} at position {position}: "
                f"pair hash probe {expected}, data {actual}"
            )
    if tokens_sha256 != probe["tokens_sha256"]:
        raise ProbeMismatch(
            f"token hash differs: probe {probe['tokens_sha256'][:12]}, data {tokens_sha256[:12]}"
        )
    if "contract_sha256" in probe and probe["contract_sha256"] != contract_sha256(probe):
        raise ProbeMismatch(
            f"contract_sha256 {str(probe['contract_sha256'])[:12]} does not match the probe's own"
            " hashes and settings (the document was edited): freeze it again"
        )
