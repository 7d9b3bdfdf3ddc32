"""Pinned-reference provenance: snapshots laid out exactly as huggingface_hub writes them, then tampered."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from huggingface_hub._local_folder import write_download_metadata
from transformers import AutoModelForCausalLM

from rewardplane.models.reference import (
    PinnedSnapshot,
    ReferenceMismatchError,
    ReferenceVerificationError,
    check_sidecar,
    git_blob_sha1,
    load_pinned_reference,
    parameter_digest,
    sidecar_for,
    verify_snapshot,
)
from rewardplane.models.tiny import tiny_config

REPO = "acme/tiny-ref"
REVISION = "0123456789abcdef0123456789abcdef01234567"
OTHER_REVISION = "fedcba9876543210fedcba9876543210fedcba98"


def etag_of(path: Path) -> str:
    """The Hub's ETag: SHA-256 for LFS-tracked weights, the git blob id for everything else."""
    if path.suffix in (".safetensors", ".bin"):
        return hashlib.sha256(path.read_bytes()).hexdigest()
    return git_blob_sha1(path)


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory) -> tuple[Path, str]:
    """A sharded tiny causal LM as save_pretrained writes it, plus its parameter digest."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("tiny-llama", vocab_size=128))
    out = tmp_path_factory.mktemp("saved")
    model.save_pretrained(out, max_shard_size="100KB")
    assert (out / "model.safetensors.index.json").exists()
    return out, parameter_digest(model)


def make_local_dir(src: Path, dest: Path, revision: str = REVISION) -> Path:
    """`hf download --local-dir` layout: files plus .cache/huggingface/download/<file>.metadata."""
    shutil.copytree(src, dest)
    for path in sorted(p for p in dest.rglob("*") if p.is_file() and ".cache" not in p.parts):
        name = path.relative_to(dest).as_posix()
        write_download_metadata(dest, name, revision, etag_of(path))
    return dest


def make_cache(src: Path, cache: Path, revision: str = REVISION) -> Path:
    """Cache layout: blobs/<etag>, snapshots/<rev>/<file> -> ../../blobs/<etag>, refs/main."""
    storage = cache / ("models--" + REPO.replace("/", "--"))
    (storage / "blobs").mkdir(parents=True)
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text(revision)
    snapshot = storage / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        etag = etag_of(path)
        shutil.copyfile(path, storage / "blobs" / etag)
        os.symlink(Path("..") / ".." / "blobs" / etag, snapshot / path.name)
    return snapshot


def first_shard(root: Path) -> str:
    index = json.loads((root / "model.safetensors.index.json").read_text())
    return sorted(set(index["weight_map"].values()))[0]


def publish(root: Path, name: str, data: bytes) -> None:
    """Rewrite a file *and* its metadata consistently (a malicious-but-consistent snapshot)."""
    (root / name).write_bytes(data)
    write_download_metadata(root, name, REVISION, etag_of(root / name))


def test_local_dir_snapshot_verifies_and_loads(saved_model, tmp_path):
    src, digest = saved_model
    root = make_local_dir(src, tmp_path / "ref")
    spec = PinnedSnapshot(REPO, REVISION, root)
    verified = verify_snapshot(spec)
    assert verified.directory == root.resolve()
    assert "config.json" in verified.etags and first_shard(root) in verified.etags
    model = load_pinned_reference(spec)
    assert parameter_digest(model) == digest
    assert not any(p.requires_grad for p in model.parameters()) and not model.training


def test_cache_snapshot_verifies(saved_model, tmp_path):
    src, _ = saved_model
    snapshot = make_cache(src, tmp_path / "hub")
    verified = verify_snapshot(PinnedSnapshot(REPO, REVISION, snapshot, cache_dir=tmp_path / "hub"))
    assert verified.directory == snapshot.resolve()


def test_replaced_weights_with_original_mtime_are_caught(saved_model, tmp_path):
    src, _ = saved_model
    root = make_local_dir(src, tmp_path / "ref")
    shard = root / first_shard(root)
    stat = shard.stat()
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # same size, different content
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(ReferenceVerificationError, match=f"{shard.name}: content hash"):
        verify_snapshot(PinnedSnapshot(REPO, REVISION, root))


def test_deleted_shard_is_caught_in_both_layouts(saved_model, tmp_path):
    src, _ = saved_model
    root = make_local_dir(src, tmp_path / "ref")
    shard = first_shard(root)
    (root / shard).unlink()
    with pytest.raises(ReferenceVerificationError, match=f"{shard}: listed in the download metadata"):
        verify_snapshot(PinnedSnapshot(REPO, REVISION, root))

    snapshot = make_cache(src, tmp_path / "hub")
    (snapshot / shard).unlink()
    with pytest.raises(ReferenceVerificationError, match=f"{shard}: listed in model.safetensors.index.json"):
        verify_snapshot(PinnedSnapshot(REPO, REVISION, snapshot, cache_dir=tmp_path / "hub"))


def test_missing_metadata_is_caught(saved_model, tmp_path):
    src, _ = saved_model
    root = make_local_dir(src, tmp_path / "ref")
    (root / ".cache" / "huggingface" / "download" / "config.json.metadata").unlink()
    with pytest.raises(ReferenceVerificationError, match="config.json: no huggingface_hub download metadata"):
        verify_snapshot(PinnedSnapshot(REPO, REVISION, root))


def test_cache_file_that_is_not_a_blob_link_is_caught(saved_model, tmp_path):
    src, _ = saved_model
    snapshot = make_cache(src, tmp_path / "hub")
    link = snapshot / "config.json"
    data = link.read_bytes()
    link.unlink()
    link.write_bytes(data)
    with pytest.raises(ReferenceVerificationError, match="config.json: not a link"):
        verify_snapshot(PinnedSnapshot(REPO, REVISION, snapshot, cache_dir=tmp_path / "hub"))


@pytest.mark.parametrize("revision", ["0123456", "main", REVISION.upper()])
def test_revision_must_be_a_full_commit(saved_model, tmp_path, revision):
    src, _ = saved_model
    root = make_local_dir(src, tmp_path / "ref")
    with pytest.raises(ReferenceVerificationError, match="full 40-hex commit"):
        verify_snapshot(PinnedSnapshot(REPO, revision, root))


def test_metadata_of_another_revision_is_caught(saved_model, tmp_path):
    src, _ = saved_model
    root = make_local_dir(src, tmp_path / "ref")
    write_download_metadata(root, "config.json", OTHER_REVISION, etag_of(root / "config.json"))
    with pytest.raises(
        ReferenceVerificationError, match=f"config.json: downloaded at revision {OTHER_REVISION}"
    ):
        verify_snapshot(PinnedSnapshot(REPO, REVISION, root))


def test_cache_snapshot_of_another_revision_is_not_resolved(saved_model, tmp_path):
    src, _ = saved_model
    make_cache(src, tmp_path / "hub", revision=OTHER_REVISION)
    configured = tmp_path / "hub" / ("models--" + REPO.replace("/", "--")) / "snapshots" / OTHER_REVISION
    with pytest.raises(ReferenceVerificationError, match="cannot resolve"):
        verify_snapshot(PinnedSnapshot(REPO, REVISION, configured, cache_dir=tmp_path / "hub"))


def test_resolved_directory_must_be_the_configured_one(saved_model, tmp_path):
    src, _ = saved_model
    snapshot = make_cache(src, tmp_path / "hub")
    elsewhere = tmp_path / "copy"
    shutil.copytree(snapshot, elsewhere)
    with pytest.raises(ReferenceVerificationError, match="not the configured"):
        verify_snapshot(PinnedSnapshot(REPO, REVISION, elsewhere, cache_dir=tmp_path / "hub"))


def test_missing_config_is_caught(saved_model, tmp_path):
    src, _ = saved_model
    root = make_local_dir(src, tmp_path / "ref")
    (root / "config.json").unlink()
    (root / ".cache" / "huggingface" / "download" / "config.json.metadata").unlink()
    with pytest.raises(ReferenceVerificationError, match="config.json: missing"):
        verify_snapshot(PinnedSnapshot(REPO, REVISION, root))


@pytest.mark.parametrize(
    ("shard", "message"),
    [
        ("../outside.safetensors", "unsafe shard path"),
        ("/etc/passwd.safetensors", "unsafe shard path"),
        (".cache/huggingface/x.safetensors", "unsafe shard path"),
        ("weights.pt", "shard .weights.pt. does not end in .safetensors"),
    ],
)
def test_weight_index_paths_are_checked(saved_model, tmp_path, shard, message):
    src, _ = saved_model
    root = make_local_dir(src, tmp_path / "ref")
    index = json.loads((root / "model.safetensors.index.json").read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = shard
    publish(root, "model.safetensors.index.json", json.dumps(index).encode())
    with pytest.raises(ReferenceVerificationError, match=f"model.safetensors.index.json: {message}"):
        verify_snapshot(PinnedSnapshot(REPO, REVISION, root))


def test_sidecar_detects_a_changed_reference(saved_model, tmp_path):
    src, _ = saved_model
    root = make_local_dir(src, tmp_path / "ref")
    model = load_pinned_reference(PinnedSnapshot(REPO, REVISION, root))
    recorded = sidecar_for(model, source="snapshot", repo=REPO, revision=REVISION)
    check_sidecar(recorded, sidecar_for(model, source="snapshot", repo=REPO, revision=REVISION))
    with torch.no_grad():
        next(model.parameters())[0, 0] += 1e-3
    with pytest.raises(ReferenceMismatchError, match="param_sha256 changed"):
        check_sidecar(recorded, sidecar_for(model, source="snapshot", repo=REPO, revision=REVISION))
