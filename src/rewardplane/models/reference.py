"""The frozen DPO reference: a provenance-checked pinned snapshot, or the step-0 policy.

DPO's implicit reward β·(log π − log π_ref) is only meaningful against the exact reference
the run started from. A reference that silently changed (a re-downloaded branch head, a file
edited in place, a shard that went missing) would still train without error and produce
numbers that cannot be compared. So a pinned reference is verified *before* any weights are
loaded:

1. `reference.revision` must be a full 40-hex commit (branches and short hashes move or
   collide);
2. `huggingface_hub.snapshot_download(..., local_files_only=True)` must resolve the repo and
   revision to exactly the configured directory (no network, no fallback to another copy);
3. every file must carry the local download metadata huggingface_hub wrote for it, and that
   metadata must name the same revision (`local_dir` downloads: the
   `.cache/huggingface/download/<file>.metadata` records; cache downloads: the snapshot folder
   name and the `blobs/<etag>` link);
4. every file's content must hash to its ETag: the git blob SHA-1 of `"blob <size>\\0" + data`
   for 40-hex ETags (regular git files), SHA-256 for 64-hex ETags (LFS files), streamed in
   bounded memory. huggingface_hub itself only compares mtimes, so a replaced file with the old
   mtime passes its check but not this one;
5. `config.json` must exist and a weight index may list only safe relative paths with the
   index's suffix, all present and verified.

Any failure raises `ReferenceVerificationError` naming the file. The checkpoint then records a
`ReferenceSidecar` (repo, revision, loader, SHA-256 over the canonical parameters), which a
resume recomputes and compares, so a reference that changed between runs is caught too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from rewardplane.core.errors import RewardplaneError
from rewardplane.core.hashing import sha256_file

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

COMMIT_RE = re.compile(r"[0-9a-f]{40}")
SHA256_RE = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20
_METADATA_DIR = Path(".cache") / "huggingface" / "download"
WEIGHT_INDEXES: dict[str, str] = {
    "model.safetensors.index.json": ".safetensors",
    "pytorch_model.bin.index.json": ".bin",
}
SINGLE_WEIGHT_FILES: tuple[str, ...] = ("model.safetensors", "pytorch_model.bin")
LOADER = "transformers.AutoModelForCausalLM"


class ReferenceVerificationError(RewardplaneError):
    """The pinned reference failed a provenance check; nothing was loaded."""

    code = "reference_unverified"


class ReferenceMismatchError(RewardplaneError):
    """A resumed run's reference differs from the one recorded in the checkpoint."""

    code = "reference_mismatch"


@dataclass(frozen=True)
class PinnedSnapshot:
    """Where a pinned reference lives and what it must be.

    `path` is the directory the user expects: a `local_dir` download, or a cache snapshot
    folder (`<cache_dir>/models--owner--name/snapshots/<revision>`); for the latter
    `cache_dir` says which cache huggingface_hub should resolve in (default: its own).
    """

    repo: str
    revision: str
    path: Path
    cache_dir: Path | None = None

    @property
    def layout(self) -> str:
        return "local_dir" if (Path(self.path) / _METADATA_DIR).is_dir() else "cache"


@dataclass(frozen=True)
class VerifiedSnapshot:
    """A snapshot that passed every check: its directory and each file's verified ETag."""

    directory: Path
    repo: str
    revision: str
    etags: dict[str, str]


def git_blob_sha1(path: Path) -> str:
    """Git's object id for a file, sha1(b"blob <size>\\0" + content), streamed."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def content_hash_for_etag(path: Path, etag: str) -> str:
    """Hash `path` the way its ETag was computed (git blob SHA-1 or LFS SHA-256)."""
    if COMMIT_RE.fullmatch(etag):
        return git_blob_sha1(path)
    if SHA256_RE.fullmatch(etag):
        return sha256_file(path)
    raise ReferenceVerificationError(
        f"{path.name}: unrecognised ETag {etag!r} (expected 40 or 64 hex digits)"
    )


def is_safe_relative(name: str) -> bool:
    """A repo-relative POSIX path that cannot leave the snapshot or hit its metadata."""
    if not name or "\\" in name or "\0" in name or ":" in name:
        return False
    pure = PurePosixPath(name)
    if pure.is_absolute() or any(part in ("", ".", "..") for part in name.split("/")):
        return False
    return pure.parts[0] != ".cache"


def resolve_snapshot(spec: PinnedSnapshot) -> Path:
    """Resolve repo + revision with huggingface_hub in local-only mode; it must be `spec.path`."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    if not COMMIT_RE.fullmatch(spec.revision):
        raise ReferenceVerificationError(
            f"reference.revision must be a full 40-hex commit hash, got {spec.revision!r}"
        )
    configured = Path(spec.path).expanduser().resolve()
    if not configured.is_dir():
        raise ReferenceVerificationError(f"reference.path {configured} is not a directory")
    kwargs: dict[str, Any] = {"revision": spec.revision, "local_files_only": True}
    if spec.layout == "local_dir":
        kwargs["local_dir"] = configured
    elif spec.cache_dir is not None:
        kwargs["cache_dir"] = Path(spec.cache_dir).expanduser().resolve()
    hub_log = logging.getLogger("huggingface_hub._snapshot_download")
    previous = hub_log.level
    hub_log.setLevel(logging.ERROR)  # "returning existing local_dir" is the expected path here
    try:
        resolved = Path(snapshot_download(spec.repo, **kwargs)).resolve()
    except (LocalEntryNotFoundError, OSError, ValueError) as exc:
        raise ReferenceVerificationError(
            f"huggingface_hub cannot resolve {spec.repo}@{spec.revision} locally: {exc}"
        ) from exc
    finally:
        hub_log.setLevel(previous)
    if resolved != configured:
        raise ReferenceVerificationError(
            f"{spec.repo}@{spec.revision} resolves to {resolved}, not the configured {configured}"
        )
    return resolved


def _read_local_dir_metadata(metadata_path: Path, name: str) -> tuple[str, str]:
    try:
        lines = metadata_path.read_text(encoding="utf-8").splitlines()
        commit, etag = lines[0].strip(), lines[1].strip()
        float(lines[2])
    except (OSError, UnicodeDecodeError, IndexError, ValueError) as exc:
        raise ReferenceVerificationError(f"{name}: unreadable download metadata {metadata_path}") from exc
    return commit, etag


def _local_dir_entries(root: Path, revision: str) -> dict[str, str]:
    """{file: etag} for a `local_dir` download; every file needs metadata for `revision`."""
    meta_root = root / _METADATA_DIR
    files = sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if (p.is_file() or p.is_symlink()) and p.relative_to(root).parts[0] not in (".cache", ".git")
    )
    recorded = sorted(
        p.relative_to(meta_root).as_posix().removesuffix(".metadata")
        for p in meta_root.rglob("*.metadata")
        if p.is_file()
    )
    for name in sorted(set(recorded) - set(files)):
        raise ReferenceVerificationError(f"{name}: listed in the download metadata but missing from {root}")
    entries: dict[str, str] = {}
    for name in files:
        metadata_path = meta_root / f"{name}.metadata"
        if not metadata_path.is_file():
            raise ReferenceVerificationError(
                f"{name}: no huggingface_hub download metadata ({metadata_path})"
            )
        commit, etag = _read_local_dir_metadata(metadata_path, name)
        if commit != revision:
            raise ReferenceVerificationError(
                f"{name}: downloaded at revision {commit or '<empty>'}, expected {revision}"
            )
        entries[name] = etag
    return entries


def _cache_entries(snapshot: Path, revision: str) -> dict[str, str]:
    """{file: etag} for a cache snapshot: each file links to `blobs/<etag>` of this repo."""
    if snapshot.name != revision or snapshot.parent.name != "snapshots":
        raise ReferenceVerificationError(
            f"{snapshot} is not the cache snapshot folder of revision {revision}"
        )
    blobs = snapshot.parent.parent / "blobs"
    entries: dict[str, str] = {}
    for path in sorted(snapshot.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            continue
        name = path.relative_to(snapshot).as_posix()
        if not path.is_symlink():
            raise ReferenceVerificationError(
                f"{name}: not a link into the cache's blobs (no download metadata)"
            )
        target = (path.parent / os.readlink(path)).resolve(strict=False)
        if target.parent != blobs.resolve() or not target.exists():
            raise ReferenceVerificationError(
                f"{name}: links to {target}, not to an existing blob of this repo"
            )
        entries[name] = target.name
    return entries


def verify_snapshot(spec: PinnedSnapshot) -> VerifiedSnapshot:
    """Run every provenance check; raise `ReferenceVerificationError` naming the first bad file."""
    root = resolve_snapshot(spec)
    if spec.layout == "local_dir":
        entries = _local_dir_entries(root, spec.revision)
    else:
        entries = _cache_entries(root, spec.revision)
    for name, etag in entries.items():
        actual = content_hash_for_etag(root / name, etag)
        if actual != etag:
            raise ReferenceVerificationError(f"{name}: content hash {actual} does not match its ETag {etag}")
    if "config.json" not in entries:
        raise ReferenceVerificationError(f"config.json: missing from {root}")
    _check_weights(root, entries)
    log.info("verified reference %s@%s (%d files) at %s", spec.repo, spec.revision, len(entries), root)
    return VerifiedSnapshot(directory=root, repo=spec.repo, revision=spec.revision, etags=entries)


def _check_weights(root: Path, entries: dict[str, str]) -> None:
    indexes = [name for name in WEIGHT_INDEXES if name in entries]
    if not indexes and not any(name in entries for name in SINGLE_WEIGHT_FILES):
        raise ReferenceVerificationError(
            f"no weights in {root}: expected one of {', '.join([*SINGLE_WEIGHT_FILES, *WEIGHT_INDEXES])}"
        )
    for index in indexes:
        suffix = WEIGHT_INDEXES[index]
        try:
            weight_map = json.loads((root / index).read_text(encoding="utf-8"))["weight_map"]
            shards = set(weight_map.values())
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ReferenceVerificationError(f"{index}: not a weight index with a weight_map") from exc
        for shard in sorted(shards, key=str):
            if not isinstance(shard, str) or not is_safe_relative(shard):
                raise ReferenceVerificationError(f"{index}: unsafe shard path {shard!r}")
            if not shard.endswith(suffix):
                raise ReferenceVerificationError(f"{index}: shard {shard!r} does not end in {suffix}")
            if shard not in entries:
                raise ReferenceVerificationError(f"{shard}: listed in {index} but missing from {root}")


def load_pinned_reference(
    spec: PinnedSnapshot, *, dtype: torch.dtype | None = None, attn_implementation: str | None = None
):
    """Verify, then load the snapshot as a frozen causal LM (never remote code)."""
    from transformers import AutoModelForCausalLM

    from rewardplane.models.attention import resolve_attn_implementation

    verified = verify_snapshot(spec)
    model = AutoModelForCausalLM.from_pretrained(
        verified.directory,
        local_files_only=True,
        trust_remote_code=False,
        dtype=dtype,
        attn_implementation=resolve_attn_implementation(attn_implementation),
    )
    return freeze(model)


def freeze(model):
    """Eval mode (no dropout) and no gradients: the reference never trains."""
    model.eval()
    model.requires_grad_(False)
    return model


def parameter_digest(model) -> str:
    """SHA-256 over the canonical state dict: sorted names, dtype, shape and raw bytes.

    Tied weights appear under each name, which is deterministic for a given architecture.
    """
    import torch

    digest = hashlib.sha256()
    state = model.state_dict()
    for name in sorted(state):
        tensor = state[name].detach()
        header = json.dumps([name, str(tensor.dtype), list(tensor.shape)]).encode()
        digest.update(len(header).to_bytes(8, "little") + header)
        flat = tensor.to("cpu").contiguous().reshape(-1)
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class ReferenceSidecar:
    """What a checkpoint records about its reference, compared on resume.

    `source` is "snapshot" (a pinned repo@revision) or "initial_policy" (the step-0 policy,
    rebuilt from the policy's own source on resume); `repo`/`revision` are empty for the latter
    unless the policy itself came from a pinned snapshot.
    """

    source: str
    repo: str
    revision: str
    loader: str
    param_sha256: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ReferenceSidecar:
        try:
            return cls(
                **{key: str(obj[key]) for key in ("source", "repo", "revision", "loader", "param_sha256")}
            )
        except KeyError as exc:
            raise ReferenceMismatchError(f"reference sidecar lacks {exc.args[0]!r}") from exc


def sidecar_for(
    model, *, source: str, repo: str = "", revision: str = "", loader: str = LOADER
) -> ReferenceSidecar:
    return ReferenceSidecar(
        source=source, repo=repo, revision=revision, loader=loader, param_sha256=parameter_digest(model)
    )


def check_sidecar(recorded: ReferenceSidecar, current: ReferenceSidecar) -> None:
    """Refuse to resume against a reference that is not the one the run started with."""
    for key, was in recorded.to_json().items():
        now = getattr(current, key)
        if now != was:
            raise ReferenceMismatchError(
                f"reference {key} changed since the checkpoint: recorded {was}, now {now}"
            )
