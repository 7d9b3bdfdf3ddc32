"""Service configuration: which scorers to host and the request limits, loaded from YAML.

```yaml
token: null            # or set REWARDPLANE_TOKEN
limits: {max_body_bytes: 33554432, max_items: 1024, max_image_pixels: 16777216}
scorers:
  - {name: clip, kind: clip, shape: clip-vit-l-14, dtype: fp16, max_batch_size: 64}
  - {name: rm, kind: rm, path: demo-run/model}
```

Every key is checked by the one config loader (`rewardplane.core.config`, docs/config.md): an
unknown key, a wrong type or an unknown scorer kind is a one-line `ConfigError` naming the
dotted key (`scorers[0].max_batch_size`, `scorers[2].options.timeout_s`), so a typo never
silently falls back to a default. A scorer's spec and its kind's registry are
`rewardplane.serve.scorers.registry`'s; each kind's `Scorer.Options` model types its options.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from rewardplane.core.config import ConfigModel, parse, read_yaml
from rewardplane.core.errors import ConfigError
from rewardplane.serve.audit.config import AuditConfig
from rewardplane.serve.scorers.registry import ScorerSpec

__all__ = ["Limits", "ServiceConfig", "config_from_dict", "load_config"]


class Limits(ConfigModel):
    """Request limits with safe defaults; exceeding one is a 413, never a crash or a slow death."""

    model_config = ConfigDict(frozen=True)

    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0)
    max_items: int = Field(1024, gt=0)
    max_image_pixels: int = Field(4096 * 4096, gt=0)
    queue_timeout_s: float = Field(30.0, gt=0)
    request_timeout_s: float = Field(120.0, gt=0)


class ServiceConfig(ConfigModel):
    model_config = ConfigDict(frozen=True)

    scorers: list[ScorerSpec]
    limits: Limits = Field(default_factory=Limits)
    token: str | None = None
    prefetch_images: bool = True
    """Decode a request's images when it arrives (thread pool, off the event loop, once for every
    image scorer of the process); false: each batch decodes its own images in one call."""
    audit: AuditConfig | None = None
    """Re-score a sample of the proxy's items with auditors and raise alarms (docs/audit.md)."""

    @model_validator(mode="after")
    def _unique_names(self) -> ServiceConfig:
        names = [s.name for s in self.scorers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate scorer names: {dupes}")
        return self

    @model_validator(mode="after")
    def _audited_scorers_hosted(self) -> ServiceConfig:
        missing = [
            n for n in (self.audit.hosted() if self.audit else []) if n not in {s.name for s in self.scorers}
        ]
        if missing:
            raise ValueError(f"audit names scorers this service does not host: {missing}")
        return self

    def resolved_token(self) -> str | None:
        """The configured token, else `REWARDPLANE_TOKEN`; empty means no authentication."""
        return self.token or os.environ.get("REWARDPLANE_TOKEN") or None


def config_from_dict(raw: Any) -> ServiceConfig:
    """Validate a service document by the loader's rules: every scorer's kind registered, its
    options parsed by the kind's model."""
    if not isinstance(raw, dict):
        raise ConfigError("service config must be a mapping with a 'scorers' list")
    scorers = raw.get("scorers")
    if not isinstance(scorers, list) or not scorers:
        raise ConfigError("service config: 'scorers' must be a non-empty list")
    return parse(ServiceConfig, raw)


def load_config(path: str | Path) -> ServiceConfig:
    return config_from_dict(read_yaml(path))
