"""The audit's Prometheus metrics, on the service's registry next to `serve.metrics`'s.

Gauges hold the last closed bin's numbers (what a dashboard plots over time); counters say
where every sampled item went, so "dropped under load" is visible, never silent.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

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


class AuditMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.items = Counter(
            "rewardplane_audit_items",
            "Proxy-scored items by what the audit did with them: sampled, audited, dropped (queue "
            "full / over its bytes), auditor_failed, unversioned (no version, not audited), "
            "bad_version, late (its version was already binned)",
            ["outcome"],
            registry=r,
        )
        self.auditor_errors = Counter(
            "rewardplane_audit_auditor_errors", "Items an auditor failed to score", ["auditor"], registry=r
        )
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
        for outcome in OUTCOMES:
            self.items.labels(outcome)

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
