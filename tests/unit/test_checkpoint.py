"""CheckpointManager: complete or ignored, newest verified wins, older ones are the fallback."""
import json
from pathlib import Path

import pytest

from slurmtools.checkpoint.manager import MANIFEST, CheckpointManager, verify_dir
from slurmtools.errors import CheckpointError


def writer(payload: bytes):
    def write(d: Path) -> None:
        (d / "shard0.bin").write_bytes(payload)
        (d / "sub").mkdir()
        (d / "sub" / "meta.txt").write_text("x")
    return write


def test_save_commits_atomically_with_manifest(tmp_path):
    m = CheckpointManager(tmp_path)
    ckpt = m.save(10, writer(b"abc"), {"world_size": 4, "attempt_id": "7.1"})
    assert ckpt.path == tmp_path / "step_10"
    assert not (tmp_path / "step_10.tmp").exists()
    manifest = json.loads((ckpt.path / MANIFEST).read_text())
    assert manifest["step"] == 10 and manifest["world_size"] == 4 and manifest["attempt_id"] == "7.1"
    assert manifest["files"]["shard0.bin"] == {"size": 3, "xxh3_128": "06b05ab6733a618578af5f94892f3950"}
    assert set(manifest["files"]) == {"shard0.bin", "sub/meta.txt"}
    assert m.latest().step == 10


def test_a_manifest_written_with_sha256_still_verifies_and_a_wrong_sha256_is_still_caught(tmp_path):
    """Checkpoints committed before the manifests moved to xxh3-128 resume as they are."""
    import hashlib
    m = CheckpointManager(tmp_path)
    for step in (4, 8):
        ckpt = m.save(step, writer(b"abc"))
        manifest = json.loads((ckpt.path / MANIFEST).read_text())
        for rel, info in manifest["files"].items():
            data = (ckpt.path / rel).read_bytes() if step == 4 else b"not the file"
            manifest["files"][rel] = {"size": info["size"], "sha256": hashlib.sha256(data).hexdigest()}
        (ckpt.path / MANIFEST).write_text(json.dumps(manifest))
    latest = m.latest()
    assert latest.step == 4 and latest.manifest["files"]["shard0.bin"]["sha256"] == hashlib.sha256(b"abc").hexdigest()


def test_staging_dir_without_manifest_is_ignored(tmp_path):
    m = CheckpointManager(tmp_path)
    m.save(5, writer(b"old"))
    tmp = m.begin(10)                       # a writer killed mid-save leaves only this
    (tmp / "shard0.bin").write_bytes(b"partial")
    assert m.latest().step == 5


def test_final_dir_without_manifest_is_ignored(tmp_path):
    m = CheckpointManager(tmp_path)
    m.save(5, writer(b"old"))
    (tmp_path / "step_9").mkdir()
    (tmp_path / "step_9" / "shard0.bin").write_bytes(b"x")
    assert m.latest().step == 5


def test_flipped_byte_falls_back_to_previous(tmp_path):
    m = CheckpointManager(tmp_path)
    m.save(5, writer(b"old-data"))
    m.save(10, writer(b"new-data"))
    shard = tmp_path / "step_10" / "shard0.bin"
    data = bytearray(shard.read_bytes())
    data[2] ^= 0x01
    shard.write_bytes(bytes(data))
    assert verify_dir(tmp_path / "step_10") [1] == "checksum mismatch in shard0.bin"
    assert m.latest().step == 5
    assert m.latest(checksums=False).step == 10   # sizes alone cannot see it


def test_truncated_file_and_bad_manifest(tmp_path):
    m = CheckpointManager(tmp_path, keep=3)
    m.save(1, writer(b"aaaa"))
    m.save(2, writer(b"bbbb"))
    m.save(3, writer(b"cccc"))
    (tmp_path / "step_3" / "shard0.bin").write_bytes(b"cc")
    (tmp_path / "step_2" / MANIFEST).write_text("{not json")
    assert verify_dir(tmp_path / "step_3")[1] == "size mismatch in shard0.bin (2 != 4)"
    assert verify_dir(tmp_path / "step_2")[1].startswith("unreadable manifest")
    assert m.latest().step == 1


def test_retention_keeps_newest_and_removes_stale_staging(tmp_path):
    m = CheckpointManager(tmp_path, keep=2)
    stale = m.begin(1)
    for step in (2, 4, 6, 8):
        m.save(step, writer(str(step).encode()))
    assert [c.step for c in m.complete()] == [8, 6]
    assert not stale.exists()


def test_keep_must_be_at_least_two(tmp_path):
    with pytest.raises(CheckpointError, match="keep must be >= 2"):
        CheckpointManager(tmp_path, keep=1)


def test_never_writes_into_an_existing_directory(tmp_path):
    m = CheckpointManager(tmp_path)
    m.save(3, writer(b"a"))
    m.begin(3)
    with pytest.raises(CheckpointError, match="already exists"):
        m.commit(3)


def test_saving_an_existing_complete_step_is_a_no_op(tmp_path):
    m = CheckpointManager(tmp_path)
    first = m.save(3, writer(b"a"))
    again = m.save(3, writer(b"DIFFERENT"))
    assert again.manifest == first.manifest


def test_an_existing_corrupt_step_is_quarantined_then_rewritten(tmp_path):
    m = CheckpointManager(tmp_path)
    m.save(3, writer(b"aaaa"))
    (tmp_path / "step_3" / "shard0.bin").write_bytes(b"zzzz")
    m.save(3, writer(b"bbbb"))
    assert (tmp_path / "step_3" / "shard0.bin").read_bytes() == b"bbbb"
    assert [p.name.startswith("step_3.bad-") for p in tmp_path.iterdir()].count(True) == 1


def test_empty_writer_is_an_error(tmp_path):
    m = CheckpointManager(tmp_path)
    with pytest.raises(CheckpointError, match="wrote no files"):
        m.save(1, lambda d: None)


def test_empty_root(tmp_path):
    assert CheckpointManager(tmp_path / "missing").latest() is None


class _DcpLikeFailure(Exception):
    """The shape of DCP's CheckpointException: failures maps a rank to (exception, traceback)."""

    def __init__(self, failures: dict) -> None:
        super().__init__("CheckpointException ranks:" + repr(sorted(failures)))
        self.failures = failures


def test_why_save_failed_is_one_line_naming_the_first_failed_rank_and_its_error():
    from slurmtools.checkpoint.manager import why_save_failed
    nested = _DcpLikeFailure({3: (OSError(5, "Input/output\nerror"), "tb"),
                              1: (OSError(28, "No space left on device"), "tb")})
    assert why_save_failed(nested) == "rank 1: OSError: [Errno 28] No space left on device"
    assert why_save_failed(RuntimeError("a\n  b")) == "RuntimeError: a b"
    assert len(why_save_failed(ValueError("x" * 1000))) == 300
