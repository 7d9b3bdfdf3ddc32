"""The `GET /v1/audit` body read as a trainer reads it (docs/audit.md): the flat
`{"audit/...": float}` dict trainers log (TRL's `log_metric`, verl's `Tracking.log`, OpenRLHF's
`extra_logs`) and the alarms firing. Part of the wire's vocabulary, so the service (its OpenRLHF
route's `extra_logs`) and the trainer side (`integrations/audit.py`, through the client's
`audit()`) decode it with the same code.

Keys: `audit/version` (newest version in a closed bin), `audit/proxy_mean`,
`audit/<auditor>/{mean,tau,gap}`, `audit/signature/<name>` (rate), `audit/alarm/<alarm>` (1 when
any subject of it fires at the newest bin, else 0) and `audit/alarm/<alarm>/<subject>`,
`audit/audited`, `audit/dropped_frac` (share of sampled items dropped under load), `audit/epoch`
(the current epoch: a restart from a checkpoint starts the next). A number the
audit does not have yet (no closed bin, τ undefined) is left out, never sent as 0.
"""

from __future__ import annotations

import math
from typing import Any

PREFIX = "audit/"


def flat_metrics(body: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}

    def put(key: str, value: Any) -> None:
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            out[PREFIX + key] = float(value)

    out.update(flat_counts(body.get("counts", {})))
    put("epoch", body.get("epoch"))
    bins = body.get("bins") or []
    if bins:
        last = bins[-1]
        put("version", last["versions"][1])
        put("proxy_mean", last["proxy"]["mean"])
        for name, block in last["auditors"].items():
            put(f"{name}/mean", block["mean"])
            put(f"{name}/tau", (block.get("tau") or {}).get("point"))
            put(f"{name}/tilt", (block.get("tilt") or {}).get("point"))
            put(f"{name}/gap", (block.get("gap") or {}).get("mean"))
        for name, block in last["signatures"].items():
            put(f"signature/{name}", block["rate"])
    for alarm, subjects in body.get("alarms", {}).items():
        put(f"alarm/{alarm}", 1.0 if any(e.get("firing") for e in subjects.values()) else 0.0)
        for subject, entry in subjects.items():
            put(f"alarm/{alarm}/{subject}", 1.0 if entry.get("firing") else 0.0)
    return out


def flat_counts(counts: dict[str, int]) -> dict[str, float]:
    """`audit/audited` and `audit/dropped_frac` from the counters (refreshed at every batch; the
    rest only as bins close)."""
    out = {PREFIX + "audited": float(counts.get("audited", 0))}
    sampled = counts.get("sampled", 0)
    if sampled:
        dropped = counts.get("dropped_queue_full", 0) + counts.get("dropped_queue_bytes", 0)
        out[PREFIX + "dropped_frac"] = dropped / sampled
    return out


def firing(body: dict[str, Any], alarms: tuple[str, ...] | None = None) -> list[tuple[str, str]]:
    """(alarm, subject) of every alarm firing at the newest bin (only `alarms` when given)."""
    return [
        (alarm, subject)
        for alarm, subjects in body.get("alarms", {}).items()
        if alarms is None or alarm in alarms
        for subject, entry in subjects.items()
        if entry.get("firing")
    ]
