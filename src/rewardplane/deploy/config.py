"""`deploy.yaml`: how the scorers of one service are laid out on processes and GPUs.

A deploy file is the service config (`scorers:` and the HTTP keys) plus placement keys, so
switching layout is a one-line change of `mode:`. Everything that can be checked before a
process starts is checked here, with one clear message per problem, because a bad layout
found after warm-up costs minutes of GPU time and a half-started daemon.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator

from rewardplane.core.config import ConfigModel, canonical_dtype, parse, read_yaml
from rewardplane.core.errors import ConfigError

Mode = Literal["dedicated", "shared", "mps", "mps_external", "consolidated"]
MODES: tuple[str, ...] = ("dedicated", "shared", "mps", "mps_external", "consolidated")
MPS_MODES = ("mps", "mps_external")
CONTROL_BINARY = "nvidia-cuda-mps-control"

# Per-scorer keys that belong to placement; everything else is the serve scorer spec.
PLACEMENT_KEYS = (
    "gpu",
    "mps_active_thread_percentage",
    "mps_pinned_mem_limit",
    "memory_fraction",
    "num_replicas",
    "num_gpus",
)
TOP_LEVEL_KEYS = ("mode", "gpus", "mps", "allow_reduced_precision_partition", "imports", "ray")
REDUCED_PRECISION = {"fp16", "bf16"}  # canonical spellings (rewardplane.core.config.Dtype)
_MEM_SIZE = re.compile(r"^[1-9][0-9]*(\.[0-9]+)?[KMGT]?B?$", re.IGNORECASE)
# sun_path is 108 bytes; MPS puts its sockets a few levels below the pipe directory.
MAX_PIPE_DIR_LEN = 64


@dataclass(frozen=True)
class DeviceProbe:
    """What this host offers. Injected in tests; `detect_devices()` builds the real one."""

    cuda_available: bool
    gpu_count: int
    control_binary: str | None


def detect_devices() -> DeviceProbe:
    """Count GPUs without creating a CUDA context (NVML first, torch as a fallback)."""
    count = 0
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            count = min(count, len([v for v in visible.split(",") if v.strip()]))
    except Exception:
        try:
            import torch

            count = torch.cuda.device_count()
        except Exception:
            count = 0
    return DeviceProbe(cuda_available=count > 0, gpu_count=count, control_binary=shutil.which(CONTROL_BINARY))


class ScorerPlacement(ConfigModel):
    """One scorer: its serve spec (passed through untouched) and where it runs."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(min_length=1)
    spec: dict[str, Any]
    gpu: int | None = None
    mps_active_thread_percentage: int | None = None
    mps_pinned_mem_limit: str | None = None
    memory_fraction: float | None = Field(None, gt=0, le=1)
    num_replicas: int = Field(1, ge=1)
    num_gpus: float | None = Field(None, ge=0)

    @field_validator("mps_active_thread_percentage")
    @classmethod
    def _percentage(cls, pct: int | None) -> int | None:
        if pct is not None and not 1 <= pct <= 100:
            raise ValueError(f"{pct} is outside 1-100")
        return pct

    @field_validator("mps_pinned_mem_limit", mode="before")
    @classmethod
    def _mem_limit(cls, value: Any) -> Any:
        return None if value is None else _mem_limit(value)

    @property
    def dtype(self) -> str:
        """The spec's dtype in the loader's canonical spelling (fp32 when absent); an unknown
        spelling is returned lower-cased for the serve spec's own check to refuse."""
        raw = self.spec.get("dtype", "fp32")
        try:
            return canonical_dtype(raw)
        except ValueError:
            return str(raw).lower()


@dataclass(frozen=True)
class WorkerPlan:
    """One worker process: the scorers it hosts and the environment it starts with."""

    name: str
    scorers: tuple[ScorerPlacement, ...]
    gpu: int | None
    memory_fraction: float | None = None
    env: dict[str, str] = field(default_factory=dict)


class MpsSettings(ConfigModel):
    """`mps:`: the daemon's pipe and log directories (absolute, short enough for Unix sockets)."""

    model_config = ConfigDict(frozen=True)

    pipe_dir: str | None = None
    log_dir: str | None = None

    @field_validator("pipe_dir", "log_dir")
    @classmethod
    def _socket_dir(cls, path: str | None) -> str | None:
        if path is None:
            return None
        if not os.path.isabs(path):
            raise ValueError(f"{path!r} must be an absolute path")
        if len(path) > MAX_PIPE_DIR_LEN:
            raise ValueError(
                f"{path!r} is {len(path)} characters; Unix socket paths are limited, keep it under "
                f"{MAX_PIPE_DIR_LEN} (e.g. /tmp/rk-mps)"
            )
        return path


class _DeployDocument(ConfigModel):
    """The deploy file as written: placement keys typed here, service keys (`limits`, `token`,
    ...) passed through to the serve config, which checks them when the service starts."""

    model_config = ConfigDict(extra="allow")

    mode: Mode = "dedicated"
    gpus: list[int] = Field(default_factory=list)
    scorers: list[dict[str, Any]] = Field(min_length=1)
    mps: MpsSettings | None = None
    allow_reduced_precision_partition: bool = False
    imports: list[str] = Field(default_factory=list)
    ray: dict[str, Any] | None = None  # address, namespace, temp_dir


class DeployConfig(ConfigModel):
    """A validated layout: which scorer runs where (`parse_deploy_config` builds it)."""

    model_config = ConfigDict(frozen=True)

    mode: Mode
    gpus: tuple[int, ...]
    scorers: tuple[ScorerPlacement, ...]
    service: dict[str, Any]
    mps: MpsSettings = Field(default_factory=MpsSettings)
    allow_reduced_precision_partition: bool = False
    imports: tuple[str, ...] = ()
    ray: dict[str, Any] = Field(default_factory=dict)

    @property
    def shared_fault_domain(self) -> bool:
        """True where one process's GPU fault can take down its neighbours (shared GPU, MPS)."""
        if self.mode in MPS_MODES or self.mode == "consolidated":
            return True
        if self.mode == "shared":
            return len(self.scorers) > 1
        return False

    @property
    def request_timeout_s(self) -> float:
        """The service's `limits.request_timeout_s` (checked by the serve config; 120 if unset)."""
        return float((self.service.get("limits") or {}).get("request_timeout_s", 120.0))

    def service_dict(self) -> dict[str, Any]:
        """The plain service config (what `rewardplane serve --config` would read)."""
        return {**self.service, "scorers": [s.spec for s in self.scorers]}

    def worker_plans(self) -> list[WorkerPlan]:
        """Consolidated: one worker for everything; every other mode: one worker per scorer."""
        if self.mode == "consolidated":
            gpu = self.scorers[0].gpu
            fractions = [s.memory_fraction for s in self.scorers if s.memory_fraction is not None]
            return [
                WorkerPlan(
                    name="consolidated",
                    scorers=self.scorers,
                    gpu=gpu,
                    memory_fraction=min(fractions) if fractions else None,
                    env=_gpu_env(gpu),
                )
            ]
        plans = []
        for s in self.scorers:
            env = _gpu_env(s.gpu)
            if self.mode in MPS_MODES:
                if s.mps_active_thread_percentage is not None:
                    env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(s.mps_active_thread_percentage)
                if s.mps_pinned_mem_limit is not None:
                    env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = s.mps_pinned_mem_limit
            plans.append(
                WorkerPlan(name=s.name, scorers=(s,), gpu=s.gpu, memory_fraction=s.memory_fraction, env=env)
            )
        return plans


def _gpu_env(gpu: int | None) -> dict[str, str]:
    """Map a config GPU index (as this process enumerates GPUs) to the worker's one visible GPU."""
    if gpu is None:
        return {"CUDA_VISIBLE_DEVICES": ""}
    parent = os.environ.get("CUDA_VISIBLE_DEVICES")
    if parent:
        entries = [v.strip() for v in parent.split(",") if v.strip()]
        return {"CUDA_VISIBLE_DEVICES": entries[gpu]}
    return {"CUDA_VISIBLE_DEVICES": str(gpu)}


def normalize_mem_limit(value: Any, where: str) -> str:
    """Accept `8G` or `0=8G[,1=4G]`; return the `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` form.

    Each worker sees exactly one GPU, so the only valid device index is 0.
    """
    try:
        return _mem_limit(value)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _mem_limit(value: Any) -> str:
    text = str(value).strip()
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError("empty memory limit")
    out = []
    for part in parts:
        index, sep, size = part.partition("=")
        if not sep:
            index, size = "0", part
        if index.strip() != "0":
            raise ValueError(f"device index {index.strip()!r} in {text!r}; each worker sees one GPU, use 0")
        size = size.strip()
        if not _MEM_SIZE.match(size):
            raise ValueError(f"malformed memory size {size!r} (expected e.g. 8G, 512M, 1024MB)")
        out.append(f"0={size.upper()}")
    if len(out) > 1:
        raise ValueError(f"{text!r} names device 0 more than once")
    return out[0]


def _check_mps(mode: str, mps: MpsSettings, probe: DeviceProbe, *, given: bool) -> None:
    """An MPS mode needs CUDA and the control binary (and `mps.pipe_dir` for an external daemon);
    an `mps:` section means nothing in another mode."""
    if mode in MPS_MODES:
        if not probe.cuda_available:
            raise ConfigError(f"mode: {mode} needs CUDA, and no CUDA GPU is visible on this host")
        if probe.control_binary is None:
            raise ConfigError(f"mode: {mode} needs {CONTROL_BINARY} on PATH (part of the NVIDIA driver)")
        if mode == "mps_external" and mps.pipe_dir is None:
            raise ConfigError("mps.pipe_dir: mode mps_external needs the existing daemon's pipe directory")
    elif given:
        raise ConfigError(f"mps: only meaningful with mode mps or mps_external, not {mode}")


def _check_spread(mode: str, gpus: tuple[int, ...], placements: list[ScorerPlacement]) -> None:
    """Dedicated: one GPU per worker, enough GPUs listed; consolidated: every scorer on one GPU."""
    if mode == "dedicated":
        used = [p.gpu for p in placements if p.gpu is not None]
        if len(set(used)) != len(used):
            raise ConfigError(
                "mode: dedicated gives each worker its own GPU, but two scorers share one; "
                "list more gpus or use mode shared/mps"
            )
        if gpus and len(placements) > len(gpus):
            raise ConfigError(f"gpus: dedicated mode needs {len(placements)} GPUs, gpus lists {len(gpus)}")
    if mode == "consolidated" and len({p.gpu for p in placements}) > 1:
        raise ConfigError(
            "mode: consolidated runs every scorer in one process on one GPU; remove per-scorer gpu"
        )


def parse_deploy_config(doc: dict[str, Any], probe: DeviceProbe | None = None) -> DeployConfig:
    """Validate a deploy document. `probe` defaults to the real host (`detect_devices()`).

    Keys and types are the config loader's (one-line errors with the dotted key); what depends
    on the host (GPU ids, CUDA, the MPS control binary) and on several keys at once is checked here.
    """
    if not isinstance(doc, dict):
        raise ConfigError("deploy file: top level must be a mapping")
    parsed = parse(_DeployDocument, doc)
    probe = probe or detect_devices()
    mode = parsed.mode
    gpus = tuple(parsed.gpus)
    for g in gpus:
        if not 0 <= g < probe.gpu_count:
            raise ConfigError(f"gpus: unknown GPU id {g}; this host has {probe.gpu_count} visible GPU(s)")
    if len(set(gpus)) != len(gpus):
        raise ConfigError(f"gpus: {list(gpus)} lists a GPU twice")
    allow_rp = parsed.allow_reduced_precision_partition

    mps = parsed.mps or MpsSettings()
    _check_mps(mode, mps, probe, given=bool(doc.get("mps")))

    default_gpu = gpus[0] if gpus else None
    if mode in MPS_MODES and default_gpu is None:
        raise ConfigError(f"gpus: mode {mode} needs at least one GPU, e.g. gpus: [0]")
    names: set[str] = set()
    placements = []
    for i, raw in enumerate(parsed.scorers):
        where = f"scorers[{i}]"
        keys = {k: raw[k] for k in ("name", *PLACEMENT_KEYS) if k in raw}
        spec = {k: v for k, v in raw.items() if k not in PLACEMENT_KEYS}
        placement = parse(ScorerPlacement, {"spec": spec, **keys}, where)
        if placement.name in names:
            raise ConfigError(f"{where}: duplicate scorer name {placement.name!r}")
        names.add(placement.name)
        if placement.gpu is None:
            gpu = gpus[i] if mode == "dedicated" and i < len(gpus) else default_gpu
            placement = placement.model_copy(update={"gpu": gpu})
        elif placement.gpu not in gpus:
            raise ConfigError(f"{where}.gpu: unknown GPU id {placement.gpu}; gpus lists {list(gpus)}")
        pct = placement.mps_active_thread_percentage
        if (pct is not None or placement.mps_pinned_mem_limit is not None) and mode not in MPS_MODES:
            raise ConfigError(f"{where}: mps_* keys need mode mps or mps_external, not {mode}")
        if pct is not None and pct < 100 and placement.dtype in REDUCED_PRECISION and not allow_rp:
            raise ConfigError(
                f"{where}: dtype {placement.dtype} with mps_active_thread_percentage {pct} is refused "
                "(non-finite FP16 scores were reported under partitioned MPS on one GPU/driver stack); "
                "use float32, 100%, or set allow_reduced_precision_partition: true"
            )
        placements.append(placement)

    _check_spread(mode, gpus, placements)

    service = {k: v for k, v in doc.items() if k not in TOP_LEVEL_KEYS and k != "scorers"}
    return DeployConfig(
        mode=mode,
        gpus=gpus,
        scorers=tuple(placements),
        service=service,
        mps=mps,
        allow_reduced_precision_partition=allow_rp,
        imports=tuple(parsed.imports),
        ray=parsed.ray or {},
    )


def load_deploy_config(path: str | Path, probe: DeviceProbe | None = None) -> DeployConfig:
    return parse_deploy_config(read_yaml(path), probe)
