"""The audit's Prometheus metrics, on the service's registry next to `serve.metrics`'s.

Gauges hold the last closed bin's numbers (what a dashboard plots over time); counters say
where every sampled item went, so "dropped under load" is visible, never silent. The per-item
counters and the queue depth are read from the stream when scraped (`bind`), not updated on
the request path: a request pays a dict update, not a metric's lock per outcome.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

OUTCOMES = (
    "sampled",
    "audited",
    "dropped_queue_full",
    "dropped_queue_bytes",
    "auditor_failed",
    "unversioned",
    "bad_version",
    "late",
)


class _Counted(Collector):
    """A labelled counter read from a dict of running totals when scraped."""

    def __init__(self, name: str, documentation: str, label: str, read: Callable[[], dict[str, int]]) -> None:
        self.name, self.documentation, self.label, self.read = name, documentation, label, read

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self.name, self.documentation, labels=[self.label])
        for key, value in sorted(self.read().items()):
            family.add_metric([key], value)
        yield family


class AuditMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.registry = registry
        self.queue_depth = Gauge("rewardplane_audit_queue_depth", "Audit items waiting", registry=r)
        self.sample_rate = Gauge(
            "rewardplane_audit_sample_rate",
            "Share of proxy items sampled now (raised while the boost watches)",
            registry=r,
        )
        self.version = Gauge(
            "rewardplane_audit_version", "The newest policy version in a closed bin", registry=r
        )
        self.epoch = Gauge(
            "rewardplane_audit_epoch",
            "The epoch of the newest closed bin (a restart that reuses versions starts the next)",
            registry=r,
        )
        self.proxy_mean = Gauge("rewardplane_audit_proxy_mean", "Proxy mean, last closed bin", registry=r)
        self.auditor_mean = Gauge(
            "rewardplane_audit_auditor_mean", "Auditor mean, last closed bin", ["auditor"], registry=r
        )
        self.tau = Gauge(
            "rewardplane_audit_tau", "Kendall tau(proxy, auditor), last closed bin", ["auditor"], registry=r
        )
        self.tilt = Gauge(
            "rewardplane_audit_tilt",
            "Tilt slope: the standardised covariance of proxy and auditor (what the alarms test), last closed bin",
            ["auditor"],
            registry=r,
        )
        self.gap = Gauge(
            "rewardplane_audit_gap",
            "Proxy rise minus auditor rise since the first bin, in first-bin standard deviations",
            ["auditor"],
            registry=r,
        )
        self.signature_rate = Gauge(
            "rewardplane_audit_signature_rate", "Share of audited items with a hack signature, last closed bin",
            ["signature"], registry=r,
        )  # fmt: skip
        self.alarm = Gauge(
            "rewardplane_audit_alarm",
            "1 while an alarm fires at the last closed bin, else 0",
            ["alarm", "subject"],
            registry=r,
        )
        self.alarm_bins = Counter(
            "rewardplane_audit_alarm_bins",
            "Closed bins at which an alarm fired",
            ["alarm", "subject"],
            registry=r,
        )

    def bind(
        self,
        counts: Callable[[], dict[str, int]],
        auditor_errors: Callable[[], dict[str, int]],
        queue_depth: Callable[[], int],
        sample_rate: Callable[[], float],
    ) -> None:
        """Read the stream's running totals, queue depth and sample rate when scraped."""
        self.registry.register(_Counted(
            "rewardplane_audit_items",
            "Proxy-scored items by what the audit did with them: sampled, audited, dropped (queue "
            "full / over its bytes), auditor_failed, unversioned (no version, not audited), "
            "bad_version, late (its version was already binned)",
            "outcome",
            lambda: {**dict.fromkeys(OUTCOMES, 0), **counts()},
        ))  # fmt: skip
        self.registry.register(
            _Counted(
                "rewardplane_audit_auditor_errors",
                "Items an auditor failed to score",
                "auditor",
                auditor_errors,
            )
        )
        self.queue_depth.set_function(queue_depth)
        self.sample_rate.set_function(sample_rate)

    def observe_bin(self, summary: dict[str, Any]) -> None:
        self.version.set(summary["versions"][1])
        self.epoch.set(summary.get("epoch", 0))
        if summary["proxy"]["mean"] is not None:
            self.proxy_mean.set(summary["proxy"]["mean"])
        for name, block in summary["auditors"].items():
            if block["mean"] is not None:
                self.auditor_mean.labels(name).set(block["mean"])
            if block["tau"] is not None:
                self.tau.labels(name).set(block["tau"]["point"])
            if block.get("tilt") is not None:
                self.tilt.labels(name).set(block["tilt"]["point"])
            if block["gap"] is not None and block["gap"]["mean"] is not None:
                self.gap.labels(name).set(block["gap"]["mean"])
        for name, block in summary["signatures"].items():
            if block["rate"] is not None:
                self.signature_rate.labels(name).set(block["rate"])
        for key, verdict in summary.get("alarms", {}).items():
            alarm, _, subject = key.partition(":")
            self.alarm.labels(alarm, subject).set(1 if verdict["fired"] else 0)
            if verdict["fired"]:
                self.alarm_bins.labels(alarm, subject).inc()
