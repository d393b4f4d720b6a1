"""The job's key (slurmtools.common.job_secret): made once, the user's alone, and the MAC a snapshot's
copy carries on the wire, bound to every field of what the copy is."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurmtools.common import job_secret
from slurmtools.errors import CheckpointError

FIELDS = dict(of_rank=3, step=120, world=8, attempt="77.1", size=4096, digest=("xxh3_128", "ab" * 16))


def test_the_key_is_made_once_the_users_alone_and_kept_by_a_requeue(tmp_path: Path) -> None:
    job_secret.ensure(tmp_path)
    key = job_secret.read(tmp_path)
    info = os.stat(tmp_path / job_secret.KEY_FILE)
    assert len(key) == 32 and info.st_mode & 0o777 == 0o600 and info.st_uid == os.geteuid()
    job_secret.ensure(tmp_path)                         # the job's next run: the same key
    assert job_secret.read(tmp_path) == key
    assert sorted(p.name for p in tmp_path.iterdir()) == [job_secret.KEY_FILE]     # no temporary left


def test_a_key_anyone_else_could_read_or_swap_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / job_secret.KEY_FILE
    with pytest.raises(CheckpointError, match=r"^job key .*job\.key: No such file or directory$"):
        job_secret.read(tmp_path)
    path.write_bytes(bytes(32))
    path.chmod(0o644)
    with pytest.raises(CheckpointError, match=r"not this user's alone \(owner uid \d+, mode 0644\)$"):
        job_secret.read(tmp_path)
    path.chmod(0o600)
    path.write_bytes(bytes(31))
    with pytest.raises(CheckpointError, match=r"31 bytes, not 32$"):
        job_secret.read(tmp_path)
    path.unlink()
    (tmp_path / "elsewhere").write_bytes(bytes(32))
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CheckpointError, match=r"^job key .*: Too many levels of symbolic links$"):
        job_secret.read(tmp_path)
    path.unlink()
    os.mkfifo(path, 0o600)                              # never waited on
    with pytest.raises(CheckpointError, match=r"not a regular file$"):
        job_secret.read(tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_key_of_another_owner_is_refused(tmp_path: Path) -> None:
    path = tmp_path / job_secret.KEY_FILE
    path.write_bytes(bytes(32))
    path.chmod(0o600)
    os.chown(path, 65534, 65534)
    with pytest.raises(CheckpointError, match=r"not this user's alone \(owner uid 65534, mode 0600\)$"):
        job_secret.read(tmp_path)


def test_the_mac_binds_every_field_of_the_copy_and_the_key() -> None:
    key = bytes(range(32))
    mac = job_secret.copy_mac(key, **FIELDS)
    assert len(mac) == 64 and job_secret.mac_matches(key, mac, **FIELDS)
    changed = [dict(FIELDS, of_rank=4), dict(FIELDS, step=121), dict(FIELDS, world=7), dict(FIELDS, attempt="77.2"),
               dict(FIELDS, size=4095), dict(FIELDS, digest=("xxh3_128", "ac" * 16)), dict(FIELDS, digest=("sha256", "ab" * 16))]
    assert [job_secret.mac_matches(key, mac, **fields) for fields in changed] == [False] * len(changed)
    assert not job_secret.mac_matches(bytes(32), mac, **FIELDS)
    assert not job_secret.mac_matches(key, "", **FIELDS)
    assert not job_secret.mac_matches(key, "é" * 64, **FIELDS)


def test_the_supervisor_makes_the_key_before_any_rank_starts_and_every_attempt_keeps_it(tmp_path: Path) -> None:
    from slurmtools.requeue import step
    control = tmp_path / "control"
    step.prepare_control_dir(control)                    # the job's first attempt
    key = job_secret.read(control)
    step.prepare_control_dir(control)                    # a restart or a requeue: markers cleared, the key kept
    assert job_secret.read(control) == key
