"""The `audit:` section of a service config (docs/audit.md).

```yaml
audit:
  proxy: rm                 # the scorer the policy is trained on
  auditors: [gold]          # hosted scorers, or {url, scorer} of another rewardplane service
  sample: 0.03              # share of the proxy's scored items re-scored by every auditor
  by: policy_version        # the item metadata key that holds the policy version
  queue: 10000              # audit items waiting at most; beyond it they are dropped and counted
```

Every threshold of every alarm is here, with the default whose false-alarm rate under the
null docs/audit.md states (measured by `benchmarks/overoptimization.py --part null`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from rewardplane.core.config import ConfigModel

_FROZEN = ConfigDict(frozen=True)


class ExternalAuditor(ConfigModel):
    """An auditor hosted by another rewardplane service: `POST {url}/v1/score` with `scorer`."""

    model_config = _FROZEN

    url: str
    scorer: str
    name: str | None = None
    """How the audit reports it; default `<scorer>@<url>`."""
    token_env: str | None = None
    """The environment variable that holds its bearer token (a token never sits in the file)."""
    timeout_s: float = Field(30.0, gt=0)

    @field_validator("url")
    @classmethod
    def _http(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"must be an http(s) URL, got {url!r}")
        return url.rstrip("/")

    def label(self) -> str:
        return self.name or f"{self.scorer}@{self.url}"


def _auditor_kind(value: Any) -> str:
    return "hosted" if isinstance(value, str) else "external"


Auditor = Annotated[
    Annotated[str, Tag("hosted")] | Annotated[ExternalAuditor, Tag("external")], Discriminator(_auditor_kind)
]
"""A hosted scorer's name, or `{url, scorer, ...}` of another service."""


class OverOptimizationRule(ConfigModel):
    """Fires at a bin when the proxy is still rising and the auditor has turned (docs/audit.md)."""

    model_config = _FROZEN

    enabled: bool = True
    window: int = Field(3, ge=1)
    """Bins per window: the recent window R is compared with the window before it and with the
    auditor's best earlier window."""
    alpha_rise: float = Field(0.001, gt=0, lt=0.5)
    """One-sided level of "the proxy's mean over R is above its mean over the window before"."""
    rise_gap: int = Field(3, ge=0)
    """Bins between the window the proxy's rise is measured from and R (as many as there are, up
    to this): a slow, steady rise adds up over the gap."""
    kappa: float = Field(0.15, ge=-1, le=1)
    """Slope evidence: the upper bound of the within-bin tilt slope (the standardised covariance
    of proxy and auditor, docs/audit.md) over R is below this."""
    alpha_slope: float = Field(0.05, gt=0, lt=0.5)
    """One-sided level of that upper bound (and of the forecast's)."""
    horizon: int = Field(10, ge=0)
    """Forecast evidence: the upper bound of the tilt slope forecast this many versions ahead, at
    the proxy's current pace, is below `kappa` (0: no forecast)."""
    alpha_level: float = Field(0.0005, gt=0, lt=0.5)
    """Level evidence: the auditor's mean over R is below its best earlier window's at this level."""


class DecorrelationRule(ConfigModel):
    model_config = _FROZEN

    enabled: bool = True
    window: int = Field(3, ge=1)
    threshold: float = Field(0.0, ge=-1, le=1)
    """Fires when the upper bound of the tilt slope (proxy, auditor) over the window is below this."""
    alpha: float = Field(0.001, gt=0, lt=0.5)


class SignatureRule(ConfigModel):
    model_config = _FROZEN

    enabled: bool = True
    window: int = Field(3, ge=1)
    max_rate: float = Field(0.05, gt=0, lt=1)
    """Above: the lower bound of a signature's rate over the window exceeds this."""
    min_rise: float = Field(0.02, ge=0, lt=1)
    """Rising: that lower bound exceeds the first window's upper bound by this much."""
    alpha: float = Field(0.001, gt=0, lt=0.5)


class Boost(ConfigModel):
    """Adaptive sampling: audit `factor` times more while an epoch starts and, with `watch`,
    while the signals move (docs/audit.md "Adaptive sampling"), so the alarm's intervals are
    narrow where they decide, and a calm run costs `sample`."""

    model_config = _FROZEN
    factor: float = Field(4.0, ge=1)
    """The sample rate while boosted is `sample` × this (at most 1); 1 turns the boost off."""
    hold_bins: int = Field(3, ge=1)
    """An epoch starts boosted, and stays so until this many bins have been decided by
    `overoptimization` (after its first windows, which every later comparison reads); with
    `watch`, also for as many bins after the last one that met it or fired."""
    watch: float | None = Field(None, ge=-1, le=1)
    """None (the default): boosted at an epoch's start only, a schedule the statistics never
    move. A number: also from a bin where the proxy rises (z ≥ z(alpha_rise)) and the tilt
    slope or its forecast is below it — more samples where the slope and forecast evidence
    decide, which also gives them the power to fire on a genuinely small covariance near an
    auditor's ceiling (docs/benchmarks/audit.md: more false alarms on the control)."""
    alpha_rise: float = Field(0.005, gt=0, lt=0.5)
    """One-sided level of `watch`'s rise: looser than the alarm's (watching costs only samples),
    tight enough that a flat proxy starts watching in about 1 bin in 200."""


class AuditAlarms(ConfigModel):
    model_config = _FROZEN

    overoptimization: OverOptimizationRule = Field(default_factory=OverOptimizationRule)
    decorrelation: DecorrelationRule = Field(default_factory=DecorrelationRule)
    signature: SignatureRule = Field(default_factory=SignatureRule)


class AuditConfig(ConfigModel):
    """What to audit, how much, and with which alarms."""

    model_config = _FROZEN

    proxy: str
    auditors: list[Auditor] = Field(min_length=1)
    sample: float = Field(gt=0, le=1)
    by: str = "policy_version"
    """Item metadata key holding the policy version (a non-negative integer). The UniRL route's
    `policy_version` and the trainer adapters' steps arrive under it."""
    source_key: str = "data_source"
    """Item metadata key of the data source; statistics are also given per source."""
    arrival_window: int | None = Field(None, ge=1)
    """Items without a version: none → not audited (counted as `unversioned`); N → every N
    proxy-scored items form one version, in arrival order (for trainers that send no step)."""
    queue: int = Field(10_000, ge=1)
    queue_bytes: int = Field(256 * 1024 * 1024, ge=1024)
    """Bytes of item text and images the queue holds at most."""
    batch_size: int = Field(64, ge=1)
    batch_wait_s: float = Field(2.0, ge=0)
    """How long a worker waits to fill a batch of `batch_size` before scoring a smaller one: a
    model auditor's forward costs nearly as much for 4 items as for 64, and at a 3% sample the
    items come slowly, so full batches are what keep the audit at its share of the compute."""
    concurrency: int = Field(1, ge=1, le=64)
    """Audit batches in flight at once (each scored by every auditor)."""
    timeout_s: float = Field(60.0, gt=0)
    min_items: int = Field(100, ge=3)
    """Audited items a bin needs: consecutive versions are merged into bins of at least this many."""
    settle_versions: int = Field(6, ge=0)
    """A version is final once an item this many versions newer has been audited. Async
    trainers' workers send items of a version after newer ones: set it above the largest lag
    (docs/audit.md "Async trainers"); the default covers a worker 1-4 versions behind."""
    max_version_jump: int = Field(1000, ge=1)
    """A version more than this ahead of the newest one seen (in this epoch) is refused for its
    item (`bad_version`) and never moves the clock: a worker that sends a timestamp, or a
    hostile one, cannot age out every later item."""
    restart_gap_s: float = Field(30.0, gt=0)
    """A version below the newest one, arriving after this long without a versioned item, is a
    restart from a checkpoint: it starts a new epoch (statistics per epoch and version)."""
    keep_epochs: int = Field(16, ge=1)
    """Epochs whose statistics are kept; older ones are let go."""
    max_bin_versions: int = Field(8, ge=1)
    """`GET /v1/audit` says the evidence is insufficient when a bin needs more versions than this
    to reach `min_items` (at the audited items a version of the newest versions)."""
    max_items_per_version: int = Field(2048, ge=16)
    """Audited items kept per version (a uniform reservoir beyond it)."""
    keep_versions: int = Field(256, ge=4)
    """Versions whose items are kept; older ones keep their summary only."""
    length_unit: Literal["words", "chars"] = "words"
    length_cap: int | None = Field(None, ge=1)
    """The trainer's completion limit in `length_unit` (or set `metadata.truncated`): the share
    of responses at the cap is reported."""
    replicates: int = Field(1000, ge=100)
    """Bootstrap replicates of each reported interval."""
    seed: int = 0
    out: str | None = None
    """A directory: `audit.json` is written there (atomically) after each bin closes."""
    alarms: AuditAlarms = Field(default_factory=AuditAlarms)
    boost: Boost = Field(default_factory=Boost)

    @model_validator(mode="after")
    def _distinct(self) -> AuditConfig:
        names = self.auditor_names()
        if self.proxy in names:
            raise ValueError(f"the proxy {self.proxy!r} cannot audit itself")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"auditors named twice: {dupes}")
        return self

    def auditor_names(self) -> list[str]:
        return [a if isinstance(a, str) else a.label() for a in self.auditors]

    def hosted(self) -> list[str]:
        """The scorers of this service that the audit needs (the proxy and hosted auditors)."""
        return [self.proxy, *(a for a in self.auditors if isinstance(a, str))]
