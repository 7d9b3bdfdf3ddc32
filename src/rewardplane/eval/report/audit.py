"""The audit section: a service's `audit.json` (the `GET /v1/audit` body, docs/audit.md) as a
page — proxy and auditors over versions with their intervals, the alarms where they fired,
the association between them, and the hack signatures' rates.

It reads the JSON only (schema `rewardplane.audit/1`), so it renders a file saved from a live
service (`curl .../v1/audit > RUN/audit.json`) or written by the service's `audit.out`.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from rewardplane.core.errors import UsageError
from rewardplane.eval.report.page import Page, add_table, fmt, png, pyplot

AUDIT_FILE = "audit.json"
AUDIT_SCHEMA = "rewardplane.audit/1"
MARKERS = {"overoptimization": ("C3", "-"), "decorrelation": ("C4", "--"), "signature": ("C1", ":")}


def read_audit(path: Path) -> dict[str, Any]:
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable audit snapshot ({exc})", code="bad_audit_file") from None
    if not isinstance(body, dict) or body.get("schema") != AUDIT_SCHEMA:
        raise UsageError(f"{path}: not an audit snapshot (schema {AUDIT_SCHEMA})", code="bad_audit_file")
    return body


def _x(bins: list[dict[str, Any]]) -> list[int]:
    return [b["versions"][1] for b in bins]


def _epochs(bins: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The bins of each epoch (a restart from a checkpoint reuses versions: an epoch's curve is
    never joined to the next one's)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for b in bins:
        out.setdefault(b.get("epoch", 0), []).append(b)
    return [out[e] for e in sorted(out)]


def _band(ax: Any, bins: list[dict[str, Any]], get: Any, label: str, color: str) -> None:
    for k, part in enumerate(_epochs(bins)):
        rows = [
            (b["versions"][1], get(b)) for b in part if get(b) is not None and get(b).get("mean") is not None
        ]
        if not rows:
            continue
        xs = [x for x, _ in rows]
        means = [r["mean"] for _, r in rows]
        low = [r["ci_95"][0] if r.get("ci_95") else r["mean"] for _, r in rows]
        high = [r["ci_95"][1] if r.get("ci_95") else r["mean"] for _, r in rows]
        ax.plot(xs, means, color=color, marker="o", markersize=3, linewidth=1.3, label=label if k == 0 else None,
                linestyle=("-", "--")[k % 2])  # fmt: skip
        ax.fill_between(xs, low, high, color=color, alpha=0.2, linewidth=0)


def first_firings(body: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(alarm, subject, version) of each alarm's first firing, in version order."""
    out = []
    for alarm, subjects in body.get("alarms", {}).items():
        for subject, entry in subjects.items():
            if entry.get("first_fired_versions"):
                out.append((alarm, subject, entry["first_fired_versions"][1]))
    return sorted(out, key=lambda r: r[2])


def audit_png(
    body: dict[str, Any],
    truth: dict[str, tuple[list[int], list[float]]] | None = None,
    marks: dict[str, int] | None = None,
) -> bytes:
    """Proxy, auditors (with `truth` curves if given), τ and signature rates over the versions
    (x = each closed bin's newest version); vertical lines where each alarm first fired, and
    grey dotted ones at `marks` (label → version)."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    bins = body.get("bins", [])
    signatures = [s for s in body.get("signatures", []) if any(b["signatures"][s]["count"] for b in bins)]
    panels = 3 + bool(signatures)
    fig, axes = plt.subplots(panels, 1, figsize=(7.6, 2.3 * panels), sharex=True, squeeze=False)
    axes = axes[:, 0]
    _band(axes[0], bins, lambda b: b["proxy"], f"proxy ({body['proxy']})", "C0")
    axes[0].set_ylabel("proxy mean")
    for k, name in enumerate(body["auditors"]):
        _band(axes[1], bins, lambda b, n=name: b["auditors"][n], f"auditor ({name})", f"C{2 + k}")
    for k, (label, (xs, ys)) in enumerate((truth or {}).items()):
        axes[1].plot(xs, ys, color="black", linestyle=("-", "--", ":")[k % 3], linewidth=1, label=label)
    axes[1].set_ylabel("auditor mean")
    for k, name in enumerate(body["auditors"]):
        _band(axes[2], bins, lambda b, n=name: _as_band(b["auditors"][n].get("tilt")), f"tilt(proxy, {name})",
              f"C{2 + k}")  # fmt: skip
        for e, part in enumerate(_epochs(bins)):
            rows = [
                (b["versions"][1], b["auditors"][name]["tau"]) for b in part if b["auditors"][name]["tau"]
            ]
            axes[2].plot([x for x, _ in rows], [t["point"] for _, t in rows], color=f"C{2 + k}", linestyle=":",
                         linewidth=1, label=f"τ(proxy, {name}), a diagnostic" if e == 0 else None)  # fmt: skip
    axes[2].axhline(0, color="grey", linewidth=0.8)
    kappa = body.get("settings", {}).get("alarms", {}).get("overoptimization", {}).get("kappa")
    if kappa is not None:
        axes[2].axhline(kappa, color="C3", linewidth=0.8, linestyle=":", label=f"κ = {kappa:g}")
    axes[2].set_ylabel("tilt slope")
    if signatures:
        for k, name in enumerate(signatures):
            axes[3].plot(_x(bins), [b["signatures"][name]["rate"] for b in bins], marker=".", label=name,
                         color=f"C{k % 10}")  # fmt: skip
        axes[3].set_ylabel("signature rate")
    for alarm, subject, version in first_firings(body):
        color, style = MARKERS.get(alarm, ("black", "-"))
        for ax in axes:
            ax.axvline(version, color=color, linestyle=style, linewidth=1.2)
        axes[0].annotate(f"{alarm} ({subject})", (version, 1.0), xycoords=("data", "axes fraction"),
                         rotation=90, va="top", ha="right", fontsize=7, color=color)  # fmt: skip
    for part in _epochs(bins)[1:]:  # a restart: where each later epoch starts
        for ax in axes:
            ax.axvline(part[0]["versions"][0], color="black", linestyle="-.", linewidth=0.8)
        axes[0].annotate(f"epoch {part[0].get('epoch')}", (part[0]["versions"][0], 0.02),
                         xycoords=("data", "axes fraction"), rotation=90, va="bottom", ha="left", fontsize=7)  # fmt: skip
    for label, version in (marks or {}).items():
        for ax in axes:
            ax.axvline(version, color="grey", linestyle=":", linewidth=1.2)
        axes[1].annotate(label, (version, 0.02), xycoords=("data", "axes fraction"), rotation=90,
                         va="bottom", ha="right", fontsize=7, color="grey")  # fmt: skip
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # versions are whole numbers
    axes[-1].set_xlabel("policy version (newest version of each bin); bands: 95% intervals")
    fig.suptitle("Audit: proxy vs auditors over policy versions", fontsize=10)
    fig.tight_layout()
    return png(fig)


def _as_band(block: dict[str, Any] | None) -> dict[str, Any] | None:
    """An estimate's JSON block (`point`, `ci_95`) as a band row (`mean`, `ci_95`)."""
    return None if block is None else {"mean": block["point"], "ci_95": block["ci_95"]}


def _headline(body: dict[str, Any]) -> str:
    counts = body.get("counts", {})
    fired = first_firings(body)
    firing = [
        f"{alarm} ({subject})"
        for alarm, subjects in body.get("alarms", {}).items()
        for subject, entry in subjects.items()
        if entry.get("firing")
    ]
    sentence = (
        f"{counts.get('audited', 0)} items audited of {counts.get('sampled', 0)} sampled "
        f"({counts.get('dropped_queue_full', 0) + counts.get('dropped_queue_bytes', 0)} dropped under load), "
        f"{len(body.get('bins', []))} closed bins through version {body.get('binned_through')}. "
    )
    if len(body.get("epochs") or []) > 1:  # a restart reused versions: each epoch is its own run
        sentence += f"{len(body['epochs'])} epochs (restarts); the newest is epoch {body.get('epoch')}. "
    if not fired:
        return sentence + "No alarm has fired."
    first = ", ".join(f"{a} ({s}) first at version {v}" for a, s, v in fired)
    now = f"firing now: {', '.join(firing)}" if firing else "none firing at the newest bin"
    return sentence + f"Alarms: {first}; {now}."


def _not_yet(body: dict[str, Any]) -> str:
    """Why `overoptimization` has no row yet: it compares the last `window` bins with the `window`
    before them, so it is decided from the 2·window-th closed bin on."""
    rule = body.get("settings", {}).get("alarms", {}).get("overoptimization", {})
    window, bins = rule.get("window"), len(body.get("bins", []))
    if not rule.get("enabled", True) or window is None or bins >= 2 * window:
        return ""
    return (
        f" overoptimization has no row yet: it compares the last {window} closed bins with the {window}"
        f" before them, so it is decided from bin {2 * window} on (this audit has {bins})."
    )


def audit_section(page: Page, body: dict[str, Any]) -> None:
    """Add the audit's headline, figure and tables to `page`."""
    headline = _headline(body)
    page.add("Audit", headline, f"<p><b>{html.escape(headline)}</b></p>")
    if body.get("bins"):
        page.add_figure(
            "Audit over versions", "audit.png", audit_png(body),
            "Proxy and auditor means per bin with 95% bootstrap intervals, the tilt slope (what the alarms "
            "test) with its interval and τ (dotted, a diagnostic), signature rates; vertical lines: where each "
            "alarm first fired, and where each epoch (a restart) starts",
        )  # fmt: skip
    rows = []
    for alarm, subjects in body.get("alarms", {}).items():
        for subject, entry in subjects.items():
            last = entry.get("last") or {}
            rows.append([alarm, subject, "yes" if entry.get("firing") else "no",
                         fmt(entry["first_fired_versions"][1]) if entry.get("first_fired_versions") else "–",
                         str(len(entry.get("fired_bins", []))), ", ".join(last.get("by", [])) or "–"])  # fmt: skip
    caption = "Rules and their false-alarm rates: docs/audit.md." + _not_yet(body)
    if rows:
        add_table(page, "Alarms", ["alarm", "subject", "firing", "first fired at version", "bins fired", "by"], rows,
                  caption)  # fmt: skip
    elif _not_yet(body):
        page.add("Alarms", caption.strip(), f"<p>{html.escape(caption.strip())}</p>")
    table = []
    for b in body.get("bins", [])[-30:]:
        cells = [
            str(b.get("epoch", 0)),
            f"{b['versions'][0]}–{b['versions'][1]}",
            str(b["n"]),
            fmt(b["proxy"]["mean"], 3),
        ]
        for name in body["auditors"]:
            block = b["auditors"][name]
            cells += [fmt(block["mean"], 3), fmt(block["tilt"]["point"], 3) if block.get("tilt") else "–",
                      fmt(block["tau"]["point"], 3) if block["tau"] else "–",
                      fmt(block["gap"]["mean"], 2) if block["gap"] else "–"]  # fmt: skip
        cells.append(fmt(b["length"]["mean"], 1))
        table.append(cells)
    if table:
        headers = ["epoch", "versions", "n", "proxy"]
        for name in body["auditors"]:
            headers += [name, f"tilt {name}", f"τ {name}", f"gap {name}"]
        add_table(page, "Bins (newest 30)", [*headers, "length"], table,
                  "gap: the proxy's rise minus the auditor's since the first bin, in first-bin standard deviations.")  # fmt: skip
    counts = body.get("counts", {})
    add_table(
        page, "Audit counters", ["what", "items"], [[k.replace("_", " "), str(v)] for k, v in counts.items()]
    )


def audit_page(path: Path, out: Path) -> Path:
    """The page for a directory that holds only an audit snapshot."""
    from rewardplane.eval.report.page import write_page

    body = read_audit(path)
    page = Page()
    audit_section(page, body)
    return write_page(out, f"rewardplane audit report: proxy {body['proxy']}", page)
