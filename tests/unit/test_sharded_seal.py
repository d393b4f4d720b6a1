"""Sharded integrity: every writer fsyncs and hashes the files it wrote; the committer merges
their records and reads only what no writer recorded; a resume's ranks each verify their share."""
from __future__ import annotations

import json
from pathlib import Path

import xxhash

from slurmtools.checkpoint import manager as checkpoint
from slurmtools.checkpoint.manager import (MANIFEST, SHARD_HASHES_DIR, CheckpointManager, seal_own_files,
                                           sealed_by_writers, verify_files, writers_sealed)


def _stage_two_writers(manager: CheckpointManager, step: int = 7) -> Path:
    staging = manager.begin(step)
    (staging / "__0_0.distcp").write_bytes(b"rank zero's shard")
    (staging / "__1_0.distcp").write_bytes(b"rank one's shard")
    (staging / ".metadata").write_bytes(b"plan")
    seal_own_files(staging, "rank_0", ["__0_0.distcp"])
    seal_own_files(staging, "rank_1", ["__1_0.distcp"])
    return staging


def test_the_committer_hashes_only_what_no_writer_sealed(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path)
    staging = _stage_two_writers(manager)
    assert writers_sealed(staging) == 2
    hashed = []
    real = checkpoint.file_digest
    monkeypatch.setattr(checkpoint, "file_digest", lambda path, *alg: hashed.append(path.name) or real(path, *alg))
    ckpt = manager.commit(7)
    assert hashed == [".metadata"]
    files = json.loads((ckpt.path / MANIFEST).read_text())["files"]
    assert files["__1_0.distcp"] == {"size": 16, "xxh3_128": xxhash.xxh3_128(b"rank one's shard").hexdigest()}
    assert sorted(files) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert not (ckpt.path / SHARD_HASHES_DIR).exists()                  # the records are not part of it
    assert manager.latest().step == 7


def test_a_record_that_does_not_match_the_file_is_not_trusted(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path)
    staging = _stage_two_writers(manager)
    (staging / "__1_0.distcp").write_bytes(b"rank one's shard, rewritten after its seal")
    (staging / SHARD_HASHES_DIR / "rank_9.json").write_text('{"__0_0.distcp": {"size": "x"}}')   # malformed
    ckpt = manager.commit(7)
    assert manager.latest().step == 7                          # the rewritten file was hashed afresh
    assert verify_files(ckpt.path, json.loads((ckpt.path / MANIFEST).read_text())["files"], ["__1_0.distcp"]) is None


def test_a_record_naming_a_file_outside_the_checkpoint_is_ignored(tmp_path):
    manager = CheckpointManager(tmp_path)
    staging = manager.begin(3)
    (staging / SHARD_HASHES_DIR).mkdir()
    (staging / SHARD_HASHES_DIR / "rank_0.json").write_text(json.dumps(
        {"../escape": {"size": 1, "sha256": "0" * 64}, "MANIFEST.json": {"size": 1, "sha256": "0" * 64}}))
    assert sealed_by_writers(staging) == {}


def test_each_rank_verifies_its_share_and_a_flipped_byte_is_found(tmp_path):
    manager = CheckpointManager(tmp_path)
    _stage_two_writers(manager)
    ckpt = manager.commit(7)
    files = ckpt.manifest["files"]
    shares = [sorted(files)[rank::2] for rank in range(2)]
    assert sorted(shares[0] + shares[1]) == sorted(files)                # every file once, by one rank
    data = bytearray((ckpt.path / "__1_0.distcp").read_bytes())
    data[3] ^= 1
    (ckpt.path / "__1_0.distcp").write_bytes(bytes(data))
    problems = [verify_files(ckpt.path, files, share) for share in shares]
    assert problems.count(None) == 1 and "checksum mismatch in __1_0.distcp" in problems
    (ckpt.path / ".metadata").unlink()
    assert verify_files(ckpt.path, files, [".metadata"]).startswith("cannot read .metadata (")
