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

from rewardkit.core.errors import ConfigError

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
REDUCED_PRECISION = {"float16", "fp16", "half", "bfloat16", "bf16"}
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


@dataclass(frozen=True)
class ScorerPlacement:
    """One scorer: its serve spec (passed through untouched) and where it runs."""

    name: str
    spec: dict[str, Any]
    gpu: int | None = None
    mps_active_thread_percentage: int | None = None
    mps_pinned_mem_limit: str | None = None
    memory_fraction: float | None = None
    num_replicas: int = 1
    num_gpus: float | None = None

    @property
    def dtype(self) -> str:
        return str(self.spec.get("dtype", "float32")).lower()


@dataclass(frozen=True)
class WorkerPlan:
    """One worker process: the scorers it hosts and the environment it starts with."""

    name: str
    scorers: tuple[ScorerPlacement, ...]
    gpu: int | None
    memory_fraction: float | None = None
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class MpsSettings:
    pipe_dir: str | None = None
    log_dir: str | None = None


@dataclass(frozen=True)
class DeployConfig:
    mode: Mode
    gpus: tuple[int, ...]
    scorers: tuple[ScorerPlacement, ...]
    service: dict[str, Any]
    mps: MpsSettings = MpsSettings()
    allow_reduced_precision_partition: bool = False
    imports: tuple[str, ...] = ()
    ray: dict[str, Any] = field(default_factory=dict)

    @property
    def shared_fault_domain(self) -> bool:
        """True where one process's GPU fault can take down its neighbours (shared GPU, MPS)."""
        if self.mode in MPS_MODES or self.mode == "consolidated":
            return True
        if self.mode == "shared":
            return len(self.scorers) > 1
        return False

    def service_dict(self) -> dict[str, Any]:
        """The plain service config (what `rewardkit serve --config` would read)."""
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
    text = str(value).strip()
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ConfigError(f"{where}: empty memory limit")
    out = []
    for part in parts:
        index, sep, size = part.partition("=")
        if not sep:
            index, size = "0", part
        if index.strip() != "0":
            raise ConfigError(
                f"{where}: device index {index.strip()!r} in {text!r}; each worker sees one GPU, use 0"
            )
        size = size.strip()
        if not _MEM_SIZE.match(size):
            raise ConfigError(f"{where}: malformed memory size {size!r} (expected e.g. 8G, 512M, 1024MB)")
        out.append(f"0={size.upper()}")
    if len(out) > 1:
        raise ConfigError(f"{where}: {text!r} names device 0 more than once")
    return out[0]


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    return value


def _check_mps_dir(path: str | None, where: str) -> str | None:
    if path is None:
        return None
    p = str(path)
    if not os.path.isabs(p):
        raise ConfigError(f"{where}: {p!r} must be an absolute path")
    if len(p) > MAX_PIPE_DIR_LEN:
        raise ConfigError(
            f"{where}: {p!r} is {len(p)} characters; Unix socket paths are limited, keep it under "
            f"{MAX_PIPE_DIR_LEN} (e.g. /tmp/rk-mps)"
        )
    return p


def parse_deploy_config(doc: dict[str, Any], probe: DeviceProbe | None = None) -> DeployConfig:
    """Validate a deploy document. `probe` defaults to the real host (`detect_devices()`)."""
    if not isinstance(doc, dict):
        raise ConfigError("deploy file: top level must be a mapping")
    probe = probe or detect_devices()
    mode = doc.get("mode", "dedicated")
    if mode not in MODES:
        raise ConfigError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    raw_gpus = doc.get("gpus", [])
    if not isinstance(raw_gpus, list):
        raise ConfigError("gpus: expected a list of GPU indices, e.g. [0, 1]")
    gpus = tuple(_int(g, "gpus") for g in raw_gpus)
    for g in gpus:
        if not 0 <= g < probe.gpu_count:
            raise ConfigError(f"gpus: unknown GPU id {g}; this host has {probe.gpu_count} visible GPU(s)")
    if len(set(gpus)) != len(gpus):
        raise ConfigError(f"gpus: {list(gpus)} lists a GPU twice")
    raw_scorers = doc.get("scorers")
    if not isinstance(raw_scorers, list) or not raw_scorers:
        raise ConfigError("scorers: expected a non-empty list of scorer specs")
    allow_rp = doc.get("allow_reduced_precision_partition", False)
    if not isinstance(allow_rp, bool):
        raise ConfigError("allow_reduced_precision_partition: expected true or false")

    mps_doc = doc.get("mps") or {}
    if not isinstance(mps_doc, dict) or set(mps_doc) - {"pipe_dir", "log_dir"}:
        raise ConfigError("mps: expected a mapping with optional pipe_dir and log_dir")
    mps = MpsSettings(
        pipe_dir=_check_mps_dir(mps_doc.get("pipe_dir"), "mps.pipe_dir"),
        log_dir=_check_mps_dir(mps_doc.get("log_dir"), "mps.log_dir"),
    )
    if mode in MPS_MODES:
        if not probe.cuda_available:
            raise ConfigError(f"mode: {mode} needs CUDA, and no CUDA GPU is visible on this host")
        if probe.control_binary is None:
            raise ConfigError(f"mode: {mode} needs {CONTROL_BINARY} on PATH (part of the NVIDIA driver)")
        if mode == "mps_external" and mps.pipe_dir is None:
            raise ConfigError("mps.pipe_dir: mode mps_external needs the existing daemon's pipe directory")
    elif mps_doc:
        raise ConfigError(f"mps: only meaningful with mode mps or mps_external, not {mode}")

    default_gpu = gpus[0] if gpus else None
    if mode in MPS_MODES and default_gpu is None:
        raise ConfigError(f"gpus: mode {mode} needs at least one GPU, e.g. gpus: [0]")
    names: set[str] = set()
    placements = []
    for i, raw in enumerate(raw_scorers):
        if not isinstance(raw, dict):
            raise ConfigError(f"scorers[{i}]: expected a mapping")
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"scorers[{i}]: needs a name")
        if name in names:
            raise ConfigError(f"scorers[{i}]: duplicate scorer name {name!r}")
        names.add(name)
        where = f"scorers[{name}]"
        spec = {k: v for k, v in raw.items() if k not in PLACEMENT_KEYS}
        gpu = raw.get("gpu")
        if gpu is None:
            gpu = gpus[i] if mode == "dedicated" and i < len(gpus) else default_gpu
        else:
            gpu = _int(gpu, f"{where}.gpu")
            if gpu not in gpus:
                raise ConfigError(f"{where}.gpu: unknown GPU id {gpu}; gpus lists {list(gpus)}")
        pct = raw.get("mps_active_thread_percentage")
        limit = raw.get("mps_pinned_mem_limit")
        if (pct is not None or limit is not None) and mode not in MPS_MODES:
            raise ConfigError(f"{where}: mps_* keys need mode mps or mps_external, not {mode}")
        if pct is not None:
            pct = _int(pct, f"{where}.mps_active_thread_percentage")
            if not 1 <= pct <= 100:
                raise ConfigError(f"{where}.mps_active_thread_percentage: {pct} is outside 1-100")
        if limit is not None:
            limit = normalize_mem_limit(limit, f"{where}.mps_pinned_mem_limit")
        frac = raw.get("memory_fraction")
        if frac is not None:
            if isinstance(frac, bool) or not isinstance(frac, int | float) or not 0 < frac <= 1:
                raise ConfigError(f"{where}.memory_fraction: expected a number in (0, 1], got {frac!r}")
            frac = float(frac)
        replicas = _int(raw.get("num_replicas", 1), f"{where}.num_replicas")
        if replicas < 1:
            raise ConfigError(f"{where}.num_replicas: must be at least 1")
        num_gpus = raw.get("num_gpus")
        if num_gpus is not None and (
            isinstance(num_gpus, bool) or not isinstance(num_gpus, int | float) or num_gpus < 0
        ):
            raise ConfigError(f"{where}.num_gpus: expected a non-negative number, got {num_gpus!r}")
        placement = ScorerPlacement(
            name=name,
            spec=spec,
            gpu=gpu,
            mps_active_thread_percentage=pct,
            mps_pinned_mem_limit=limit,
            memory_fraction=frac,
            num_replicas=replicas,
            num_gpus=None if num_gpus is None else float(num_gpus),
        )
        if pct is not None and pct < 100 and placement.dtype in REDUCED_PRECISION and not allow_rp:
            raise ConfigError(
                f"{where}: dtype {placement.dtype} with mps_active_thread_percentage {pct} is refused "
                "(non-finite FP16 scores were reported under partitioned MPS on one GPU/driver stack); "
                "use float32, 100%, or set allow_reduced_precision_partition: true"
            )
        placements.append(placement)

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

    imports = doc.get("imports", [])
    if not isinstance(imports, list) or not all(isinstance(m, str) for m in imports):
        raise ConfigError("imports: expected a list of module names")
    ray_opts = doc.get("ray", {}) or {}
    if not isinstance(ray_opts, dict):
        raise ConfigError("ray: expected a mapping (address, namespace, temp_dir)")
    service = {k: v for k, v in doc.items() if k not in TOP_LEVEL_KEYS and k != "scorers"}
    return DeployConfig(
        mode=mode,
        gpus=gpus,
        scorers=tuple(placements),
        service=service,
        mps=mps,
        allow_reduced_precision_partition=allow_rp,
        imports=tuple(imports),
        ray=ray_opts,
    )


def load_deploy_config(path: str | Path, probe: DeviceProbe | None = None) -> DeployConfig:
    import yaml

    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML ({exc})") from exc
    return parse_deploy_config(doc, probe)
