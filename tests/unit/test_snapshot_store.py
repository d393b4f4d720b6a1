"""The node's snapshot store (snapshot_io.py) on a real directory standing for node memory: own
copies and replicas sealed as checkpoints, two kept, an inventory of the verified ones only, read
back verified; a directory others can write is refused."""
from __future__ import annotations

import io
import os

import pytest
import torch
import xxhash

from slurmtools.errors import CheckpointError
from slurmtools.snapshot import rules as snapshot
from slurmtools.snapshot.rules import Copy, job_key
from slurmtools.snapshot.store import SnapshotStore, open_regular
from slurmtools.snapshot.torch_state import deserialize, serialize
from slurmtools.snapshot.wire import ViewReader


@pytest.fixture
def store(tmp_path):
    (tmp_path / "shm").mkdir()
    return SnapshotStore(tmp_path / "shm", "42-abcdef", "node1", bytes(32))


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
    store = SnapshotStore(shm, "42-abcdef", "node1", bytes(32))
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
    ended = SnapshotStore(tmp_path, job_key("41", tmp_path / "a"), "n1", bytes(32))
    ended.save_own(0, 5, {"state.pt": b"x"})
    running = SnapshotStore(tmp_path, job_key("42", tmp_path / "b"), "n1", bytes(32))
    running.save_own(0, 5, {"state.pt": b"x"})
    day_ago = ended.root.stat().st_mtime - 25 * 3600
    for path in [ended.root, *ended.root.rglob("*")]:
        os.utime(path, (day_ago, day_ago))
    SnapshotStore(tmp_path, job_key("43", tmp_path / "c"), "n1", bytes(32)).sweep_stale(
        now=running.root.stat().st_mtime + 60, live_jobs=lambda: frozenset({42, 43}))
    assert not ended.root.exists() and running.inventory() == [Copy(0, 5, "n1", True, 0)]


def test_a_pull_is_located_by_its_manifest_and_only_a_regular_file_of_its_sealed_size_is_opened(store):
    """locate gives the file, its size and the digest its manifest records (the puller checks the
    bytes against it); open_regular refuses the file once its size or kind changed."""
    path = store.save_replica(2, 30, {"state.pt": b"peer state"})
    located, size, (algorithm, digest) = store.locate(Copy(2, 30, "node1", False), "state.pt")
    assert (located, size, algorithm) == (path / "state.pt", 10, "xxh3_128")
    assert digest == xxhash.xxh3_128(b"peer state").hexdigest()
    with open_regular(located, size) as handle:
        assert handle.read() == b"peer state"
    assert open_regular(located, size + 1) is None
    with pytest.raises(CheckpointError, match=r"no other.pt in its manifest"):
        store.locate(Copy(2, 30, "node1", False), "other.pt")
    with pytest.raises(CheckpointError, match=r"step_20"):
        store.locate(Copy(2, 20, "node1", False), "state.pt")
    located.unlink()
    located.symlink_to("/dev/zero")
    assert open_regular(located, size) is None


def test_a_received_buffer_loads_in_place_and_reads_like_a_file():
    state = {"weights": torch.arange(1000, dtype=torch.float32), "step": 7}
    data = serialize(state)
    received = torch.frombuffer(bytearray(data), dtype=torch.uint8).numpy().data
    loaded = deserialize(received)
    assert torch.equal(loaded["weights"], state["weights"]) and loaded["step"] == 7
    reader = ViewReader(memoryview(b"abcdef"))
    assert (reader.read(2), reader.tell(), reader.seek(-1, io.SEEK_END), reader.read(), reader.read(3)) == (
        b"ab", 2, 5, b"f", b"")
    assert (reader.seek(1), reader.read(2), reader.seek(1, io.SEEK_CUR), reader.read()) == (1, b"bc", 4, b"ef")


def test_a_pull_lands_in_a_private_file_of_its_size_in_the_jobs_directory(store):
    path = store.incoming(3, 1000)
    assert (path.parent, path.name, path.stat().st_size) == (store.root, ".incoming-rank3", 1000)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert store.incoming(3, 10).stat().st_size == 10          # a later pull of the same rank starts afresh
    assert os.stat(path).st_blocks * 512 >= 10                    # reserved, not sparse: no SIGBUS on a full tmpfs
    store.remove(3, [])                                           # the rank's leftovers go with its copies
    assert not path.exists()


def test_an_own_copy_is_checked_where_it_lies_and_loaded_by_its_open_file(store):
    """A restore's own copy: its digest checked over the mapped file, then torch.load maps the same
    open file; a flipped byte or a link in its place is refused, naming the copy."""
    state = {"weights": torch.arange(1000, dtype=torch.float32), "step": 7}
    path = store.save_own(0, 10, {"state.pt": serialize(state)})
    with store.open_verified(Copy(0, 10, "node1", True), "state.pt") as handle:
        loaded = deserialize(handle)
    assert torch.equal(loaded["weights"], state["weights"]) and loaded["step"] == 7
    data = bytearray((path / "state.pt").read_bytes())
    data[len(data) // 2] ^= 1
    (path / "state.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"^snapshot {path}: checksum mismatch in state.pt$"):
        store.open_verified(Copy(0, 10, "node1", True), "state.pt")
    (path / "state.pt").unlink()
    (path / "state.pt").symlink_to(path.parent)
    with pytest.raises(CheckpointError, match=rf"^snapshot {path}: state.pt is not a regular file$"):
        store.open_verified(Copy(0, 10, "node1", True), "state.pt")
