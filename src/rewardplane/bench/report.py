"""Human-facing output: the console table, perf_analyzer-style CSV, report.md and PNG plots.

The CSV follows perf_analyzer's column names (latencies in microseconds) so existing
spreadsheets and plotting scripts that read perf_analyzer output read ours too.
"""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rewardplane.core.atomic import write_text

log = logging.getLogger(__name__)

CSV_COLUMNS = (
    "Mode",
    "Scorers",
    "Batch",
    "Concurrency",
    "Request Rate",
    "Inferences/Second",
    "Requests/Second",
    "Goodput/Second",
    "Server Queue",
    "Server Compute Infer",
    "Avg latency",
    "p50 latency",
    "p90 latency",
    "p95 latency",
    "p99 latency",
    "Max latency",
    "Mean Batch Size",
    "GPU Util",
    "Regime",
    "Stable",
    "OK Requests",
    "Failed Requests",
)


def _us(ms: float | None) -> str:
    return "" if ms is None else str(round(ms * 1000))


def _fmt(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def csv_rows(points: Iterable[dict[str, Any]], mode: str | None = None) -> list[list[str]]:
    rows = []
    for p in points:
        lat, timing, res = p["latency_ms"], p["server_timing_ms"], p["resources"] or {}
        batch_sizes = p["batch_size_mean"] or {}
        rows.append(
            [
                mode or p["mode"] or "",
                "+".join(p["scorers"]),
                str(p["batch"]),
                "" if p["concurrency"] is None else str(p["concurrency"]),
                "" if p["rate"] is None else str(p["rate"]),
                _fmt(p["items_per_s"], 2),
                _fmt(p["requests_per_s"], 2),
                _fmt(p["goodput_items_per_s"], 2),
                _us(timing["queue_mean"]),
                _us(timing["inference_mean"]),
                _us(lat["mean"]),
                _us(lat["p50"]),
                _us(lat["p90"]),
                _us(lat["p95"]),
                _us(lat["p99"]),
                _us(lat["max"]),
                ";".join(f"{k}={v:.2f}" for k, v in sorted(batch_sizes.items())),
                _fmt(res.get("gpu_util_mean")),
                p["regime"],
                str(p["stable"]).lower(),
                str(p["requests"]["ok"]),
                str(p["requests"]["failed"]),
            ]
        )
    return rows


def write_csv(path: str | Path, rows: Sequence[Sequence[str]]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    writer.writerows(rows)
    write_text(path, buf.getvalue())


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def point_table(points: Iterable[dict[str, Any]], label: str | None = None) -> str:
    """Per-point table (markdown; also readable in a terminal)."""
    rows = []
    for p in points:
        lat, res, timing = p["latency_ms"], p["resources"] or {}, p["server_timing_ms"]
        split = ""
        if timing["queue_mean"] is not None and timing["inference_mean"] is not None:
            split = f"{timing['queue_mean']:.1f}/{timing['inference_mean']:.1f}"
        load = f"c={p['concurrency']}" if p["concurrency"] is not None else f"r={p['rate']:g}/s"
        batch_sizes = p["batch_size_mean"] or {}
        rows.append(
            [
                label or p["mode"] or "-",
                p["batch"],
                load,
                _fmt(p["items_per_s"]),
                _fmt(p["goodput_items_per_s"]),
                "/".join(_fmt(lat[k]) for k in ("p50", "p95", "p99")),
                _fmt(lat["max"]),
                split,
                ",".join(f"{v:.1f}" for _, v in sorted(batch_sizes.items())),
                _fmt(res.get("gpu_util_mean")),
                _fmt(res.get("cpu_util_mean")),
                p["regime"],
                "yes" if p["stable"] else "**no**",
                f"{p['requests']['ok']}/{p['requests']['total']}",
            ]
        )
    header = (
        "mode", "batch", "load", "items/s", "goodput/s", "p50/p95/p99 ms", "max ms",
        "queue/infer ms", "mean batch", "GPU %", "CPU %", "regime", "stable", "ok/total",
    )  # fmt: skip
    return markdown_table(header, rows)


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, ax: Any, path: Path, title: str) -> bool:
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_throughput(path: Path, series: dict[str, list[dict[str, Any]]], title: str) -> bool:
    """items/s vs concurrency, one panel per batch size, one line per deployment."""
    plt = _pyplot()
    if plt is None:
        return False
    batches = sorted({p["batch"] for pts in series.values() for p in pts})
    fig, axes = plt.subplots(1, len(batches), figsize=(5 * len(batches), 4), squeeze=False)
    for ax, batch in zip(axes[0], batches, strict=True):
        for label, pts in series.items():
            sel = sorted((p for p in pts if p["batch"] == batch), key=lambda p: p["concurrency"])
            if sel:
                ax.plot(
                    [p["concurrency"] for p in sel], [p["items_per_s"] for p in sel], marker="o", label=label
                )
        concurrencies = sorted(
            {p["concurrency"] for pts in series.values() for p in pts if p["batch"] == batch}
        )
        ax.set_xscale("log", base=2)
        ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
        ax.set_xlabel("concurrency (clients)")
        ax.set_ylabel("items/s (all scorers per item)")
        ax.set_title(f"batch {batch}")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_latency_cdf(path: Path, samples: dict[str, list[float]], title: str) -> bool:
    plt = _pyplot()
    if plt is None:
        return False
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, values in samples.items():
        if values:
            xs = np.sort(np.asarray(values))
            ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=label)
    ax.set_xscale("log")
    ax.set_xlabel("request latency (ms, log)")
    ax.set_ylabel("fraction of requests")
    return _save(plt, fig, ax, path, title)


def plot_utilisation(path: Path, timelines: dict[str, list[dict[str, Any]]], title: str) -> bool:
    """GPU utilisation over each deployment's run (host CPU where no GPU was sampled)."""
    plt = _pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5))
    any_gpu = any(s["gpu_util"] for tl in timelines.values() for s in tl)
    for label, timeline in timelines.items():
        if any_gpu:
            ys = [sum(s["gpu_util"]) / len(s["gpu_util"]) if s["gpu_util"] else None for s in timeline]
        else:
            ys = [s["cpu_util"] for s in timeline]
        ax.plot([s["t"] for s in timeline], ys, label=label, linewidth=1)
    ax.axhline(70, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("seconds since the deployment's first point")
    ax.set_ylabel("GPU utilisation %" if any_gpu else "host CPU utilisation % (no GPU sampled)")
    ax.set_ylim(0, 105)
    return _save(plt, fig, ax, path, title)
