"""Turn a deploy file into the backend and service config that `rewardplane serve --deploy` runs.

The gateway process validates everything it can before anything starts: the placement keys
(`parse_deploy_config`) and the serve scorer specs (`config_from_dict`, which knows every
registered scorer kind, including those from the deploy file's `imports:`).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from rewardplane.core.errors import ConfigError, UsageError
from rewardplane.deploy.config import DeployConfig, DeviceProbe, load_deploy_config

BACKENDS = ("workers", "ray")


def service_config(deploy: DeployConfig) -> Any:
    """The serve `ServiceConfig` the HTTP app is built from (scorers, limits, token)."""
    from rewardplane.serve.config import config_from_dict

    for module in deploy.imports:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"imports: cannot import {module!r}: {exc}") from None
    return config_from_dict(deploy.service_dict())


def build_backend(deploy: DeployConfig, backend: str = "workers") -> Any:
    if backend == "workers":
        from rewardplane.deploy.gateway import GatewayBackend

        return GatewayBackend(deploy)
    if backend == "ray":
        from rewardplane.deploy.ray_backend import RayBackend

        return RayBackend(deploy)
    raise UsageError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")


def load_deploy(path: str | Path, probe: DeviceProbe | None = None) -> tuple[DeployConfig, Any]:
    """(DeployConfig, ServiceConfig) of a deploy file, checked whole before anything starts."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"deploy file {p} does not exist")
    deploy = load_deploy_config(p, probe)
    return deploy, service_config(deploy)


def deploy_backend(
    path: str | Path, backend: str = "workers", probe: DeviceProbe | None = None
) -> tuple[Any, Any]:
    """(ScoringBackend, ServiceConfig) for `rewardplane serve --deploy PATH [--backend ray]`."""
    deploy, config = load_deploy(path, probe)
    return build_backend(deploy, backend), config
