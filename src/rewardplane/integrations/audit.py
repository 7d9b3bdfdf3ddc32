"""The service's audit in the trainer: a TRL `TrainerCallback`, and the flat metric dict that
verl and OpenRLHF log (docs/audit.md, docs/integrations.md).

TRL (tested with 1.16, its `GRPOTrainer` and transformers' `Trainer` loop)::

    audit = AuditCallback("http://127.0.0.1:8000", on_alarm="stop")
    reward = RemoteReward("http://127.0.0.1:8000", scorer="rm", audit=audit)
    trainer = GRPOTrainer(..., reward_funcs=[reward], callbacks=[audit])

Every `every_steps` optimizer steps the callback reads `GET /v1/audit?summary=true`; the reward
function logs the newest `audit/*` numbers through TRL's `log_metric` (so they reach every
reporter next to `kl` and `reward`, averaged per logging step), and `RemoteReward` sends TRL's
`trainer_state.global_step` as each item's `metadata.policy_version`. With `on_alarm="stop"`,
an alarm in `stop_on` firing at the service sets `control.should_training_stop`: the trainer
finishes its step, saves as configured and returns from `train()`.

verl and OpenRLHF have no callback of this kind: `audit_metrics(url)` returns the same flat
dict for a custom loop's `logger.log(data=metrics, step=...)`; OpenRLHF's `/get_reward` answer
already carries them in its `extra_logs` (docs/integrations.md).

The audit is advisory: an unreachable service or a service without an `audit:` section is a
warning (once) and `audit/available = 0`, never a failed training step.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from transformers import TrainerCallback

from rewardplane.core.errors import UsageError
from rewardplane.integrations._common import setting
from rewardplane.serve.client import RewardClient, ServiceError
from rewardplane.serve.protocol import AUDIT_PREFIX, AUDIT_ROUTE, firing, flat_metrics

log = logging.getLogger(__name__)

ALARMS = ("overoptimization", "decorrelation", "signature")


def fetch_audit(url: str, *, token: str | None = None, timeout: float = 5.0) -> dict[str, Any]:
    """`GET {url}/v1/audit?summary=true` through the client, once (no retries: the audit is
    advisory and a training step must not wait on it): counters, alarms and the newest closed
    bin. Raises `ServiceError` (unreachable, 401, 404 when the service has no `audit:` section)."""
    with RewardClient(url, token=token, timeout=timeout, max_retries=0) as client:
        return client.audit(summary=True)


def audit_metrics(
    url: str | None = None, *, token: str | None = None, timeout: float = 5.0
) -> dict[str, float]:
    """The flat `audit/*` dict for verl's or OpenRLHF's logger (docs/audit.md lists the keys);
    `url` and `token` default to `REWARDPLANE_URL` / `REWARDPLANE_TOKEN`."""
    url = setting(url, "REWARDPLANE_URL", required=True, what="URL")
    return flat_metrics(fetch_audit(url, token=setting(token, "REWARDPLANE_TOKEN"), timeout=timeout))


class AuditCallback(TrainerCallback):
    """Reads the service's audit during training; logs it, and stops training on an alarm
    when `on_alarm="stop"` (alarms named in `stop_on`)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        on_alarm: Literal["log", "stop"] = "log",
        stop_on: tuple[str, ...] = ALARMS,
        every_steps: int = 1,
        timeout: float = 5.0,
    ) -> None:
        if on_alarm not in ("log", "stop"):
            raise UsageError(f"on_alarm must be 'log' or 'stop', got {on_alarm!r}")
        unknown = sorted(set(stop_on) - set(ALARMS))
        if unknown:
            raise UsageError(f"stop_on names unknown alarms {unknown}; known: {list(ALARMS)}")
        if every_steps < 1:
            raise UsageError(f"every_steps must be >= 1, got {every_steps}")
        self.url = setting(url, "REWARDPLANE_URL", required=True, what="URL").rstrip("/")
        self.token = setting(token, "REWARDPLANE_TOKEN")
        self.on_alarm = on_alarm
        self.stop_on = tuple(stop_on)
        self.every_steps = every_steps
        self.timeout = timeout
        self.metrics: dict[str, float] = {}
        """The newest `audit/*` numbers (empty until the first read)."""
        self.stopped_by: list[tuple[str, str]] | None = None
        """The (alarm, subject) pairs that stopped training, when it was stopped."""
        self._warned = False
        self._announced: set[tuple[str, str]] = set()

    def refresh(self) -> list[tuple[str, str]]:
        """Read the audit now; the alarms firing at the service's newest bin."""
        try:
            body = fetch_audit(self.url, token=self.token, timeout=self.timeout)
        except ServiceError as exc:
            if not self._warned:
                log.warning(
                    "audit: cannot read %s%s (%s); training goes on unaudited", self.url, AUDIT_ROUTE, exc
                )
                self._warned = True
            self.metrics = {AUDIT_PREFIX + "available": 0.0}
            return []
        self.metrics = {AUDIT_PREFIX + "available": 1.0, **flat_metrics(body)}
        alarms = firing(body)
        for key in alarms:
            if key not in self._announced:
                log.warning("audit alarm %s (%s) is firing at %s", key[0], key[1], self.url)
                self._announced.add(key)
        return alarms

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.refresh()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step % self.every_steps:
            return
        alarms = [a for a in self.refresh() if a[0] in self.stop_on]
        if alarms and self.on_alarm == "stop":
            self.stopped_by = alarms
            control.should_training_stop = True
            log.warning(
                "audit: stopping training at step %d on %s",
                state.global_step,
                ", ".join(f"{a} ({s})" for a, s in alarms),
            )

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        # for loops without a reward function that logs them (see the module docstring): the
        # callbacks after this one and the caller's dict see the numbers
        if logs is not None:
            for key, value in self.metrics.items():
                logs.setdefault(key, value)
