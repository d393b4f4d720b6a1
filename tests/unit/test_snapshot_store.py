"""The node's snapshot store (snapshot_io.py) on a real directory standing for node memory: own
copies and replicas sealed as checkpoints, two kept, an inventory of the verified ones only, read
back verified; a directory others can write is refused."""
from __future__ import annotations

import os

import pytest

from slurmtools import snapshot
from slurmtools.errors import CheckpointError
from slurmtools.snapshot import Copy
from slurmtools.snapshot_io import SnapshotStore


@pytest.fixture
def store(tmp_path):
    (tmp_path / "shm").mkdir()
    return SnapshotStore(tmp_path / "shm", "42-abcdef", "node1")


def test_own_copies_and_replicas_are_sealed_and_two_are_kept(store):
    for step in (10, 20, 30):
        store.save_own(0, step, {"state.pt": b"own %d" % step}, meta={"world": 4})
    store.save_replica(2, 30, {"state.pt": b"peer"}, meta={"world": 4})
    assert sorted(store.inventory(), key=lambda c: (not c.own, c.of_rank, -c.step)) == [
        Copy(0, 30, "node1", True, 4), Copy(0, 20, "node1", True, 4), Copy(2, 30, "node1", False, 4)]
    assert store.read(Copy(0, 20, "node1", True)) == {"state.pt": b"own 20"}
    assert store.read(Copy(2, 30, "node1", False)) == {"state.pt": b"peer"}
    assert oct(os.stat(store.root).st_mode & 0o777) == "0o700"


def test_a_corrupted_copy_is_left_out_of_the_inventory_and_refused_on_reading(store):
    path = store.save_own(1, 10, {"a.bin": b"x" * 1000, "b.bin": b"y"})
    store.save_own(1, 20, {"a.bin": b"z" * 1000})
    data = bytearray((path / "a.bin").read_bytes())
    data[500] ^= 1
    (path / "a.bin").write_bytes(bytes(data))
    assert store.inventory() == [Copy(1, 20, "node1", True)]
    with pytest.raises(CheckpointError, match=r"checksum mismatch in a.bin"):
        store.read(Copy(1, 10, "node1", True))


def test_an_unsealed_copy_is_not_a_copy(store):
    manager_root = snapshot.own_dir(store.root, 3)
    store.save_own(3, 10, {"a": b"1"})
    (manager_root / "step_20.tmp").mkdir()                       # a save the node's death cut short
    (manager_root / "step_20.tmp" / "a").write_bytes(b"2")
    assert store.inventory() == [Copy(3, 10, "node1", True)]


def test_the_same_step_saved_again_replaces_it(store):
    store.save_own(0, 10, {"a": b"first"})
    store.save_own(0, 10, {"a": b"second"})
    assert store.read(Copy(0, 10, "node1", True)) == {"a": b"second"}
    assert [p.name for p in snapshot.own_dir(store.root, 0).iterdir()] == ["step_10"]


def test_a_directory_others_can_write_is_refused(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    store = SnapshotStore(shm, "42-abcdef", "node1")
    store.save_own(0, 10, {"a": b"1"})
    store.root.parent.chmod(0o777)
    assert not store.usable()
    with pytest.raises(CheckpointError, match="not a directory of this user's own"):
        store.save_own(0, 20, {"a": b"2"})


def test_bad_file_names_are_refused(store):
    for name in ("", "../x", ".hidden", "a/b"):
        with pytest.raises(CheckpointError, match="one plain name per file"):
            store.save_own(0, 10, {name: b"1"})


def test_a_finished_rank_removes_its_copies_and_stale_jobs_are_swept(store, tmp_path):
    for rank in (0, 1):
        store.save_own(rank, 5, {"state.pt": b"x"})
    store.save_replica(2, 5, {"state.pt": b"y"})
    store.remove(0, [2])
    assert sorted(path.name for path in store.root.iterdir()) == ["rank1"]
    store.remove(1, [])
    assert not store.root.exists()                       # the last one takes the job's directory
    ended = SnapshotStore(tmp_path, "41-ended", "n1")
    ended.save_own(0, 5, {"state.pt": b"x"})
    running = SnapshotStore(tmp_path, "42-running", "n1")
    running.save_own(0, 5, {"state.pt": b"x"})
    day_ago = ended.root.stat().st_mtime - 25 * 3600
    for path in [ended.root, *ended.root.rglob("*")]:
        os.utime(path, (day_ago, day_ago))
    SnapshotStore(tmp_path, "43-new", "n1").sweep_stale(now=running.root.stat().st_mtime + 60)
    assert not ended.root.exists() and running.inventory() == [Copy(0, 5, "n1", True, 0)]
