#!/usr/bin/env python3
"""In-memory snapshots (slurmtools/snapshot/torch_state.py) against the persistent checkpoint, on this
machine:

- the training thread's stall per snapshot (the state copied to host memory, over the previous
  snapshot's copy as Snapshotter does; the first snapshot's, which allocates it, too) and the background
  work (serialize, write into node memory, seal: xxh3 of every byte), for a state of --state-mb;
- restore from node memory (read, verify, load, copy into the model's tensors) against restore
  from a checkpoint on disk written
  with the same bytes (CheckpointManager: write, fsync, manifest; then read back with the page
  cache dropped where this process may, else warm): `ratio memory-restore/disk-restore <x>`;
- a peer restore for real (bench/snapshot_peer.py: two gloo ranks standing for two nodes, each with
  a node memory of its own; the snapshot taken and replicated, then rank 0 on a spare with empty
  memory pulls its state from the replica through snapshot_torch.restore): the replication time
  and `ratio peer-restore/disk-restore <x>`. The wire is TCP over this machine's loopback (the
  mini-cluster's veth links are the same kernel copy), not a fabric: on a cluster the pull runs at
  the NIC's rate while the shared file system's is shared by every node restoring at once;
- the overhead per step at one snapshot every --every steps of --step-s seconds: the stall over
  the steps it covers (goal <= 2% at every 10 steps);
- steps lost per node failure, snapshots against checkpoints alone, and the goodput simulator
  (slurmtools.requeue.simulate) for 9,600 GPUs with these figures (bench/snapshot_goodput.py).

    .venv/bin/python bench/snapshot.py [--state-mb 256] [--every 10] [--step-s 1.0] [--dir D]

--dir is where the disk checkpoint goes (default: a temporary directory on /var/tmp, a disk);
node memory is /dev/shm.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from slurmtools.checkpoint.manager import CheckpointManager  # noqa: E402
from slurmtools.snapshot.rules import DEFAULT_MAX_OVERHEAD_PCT, Copy, interval_for  # noqa: E402
from slurmtools.snapshot.store import SnapshotStore  # noqa: E402
from slurmtools.snapshot.host_copy import HostCopier  # noqa: E402
from slurmtools.snapshot.torch_state import STATE_FILE, deserialize, serialize  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import snapshot_goodput  # noqa: E402
import snapshot_peer  # noqa: E402


def _drop_cache(path: Path) -> bool:
    """Evict path's pages (posix_fadvise DONTNEED after an fsync): a cold read, as after a restart."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def apply(model: Dict[str, torch.Tensor], restored: Dict[str, object]) -> None:
    """The restored tensors copied into the trainer's own (as set_state_dict does): every restore
    path is timed until its bytes are in the model, whether it read them first or maps them."""
    for key, target in model.items():
        source = restored[key]
        assert isinstance(source, torch.Tensor)
        target.copy_(source)


def measure(state_mb: int, disk_dir: Path, memory_dir: Path) -> Dict[str, float]:
    elements = state_mb * 1024 * 1024 // 4
    state = {"weights": torch.randn(elements // 3), "exp_avg": torch.randn(elements // 3),
             "exp_avg_sq": torch.rand(elements - 2 * (elements // 3)), "step": 1000}
    copier = HostCopier()              # the Snapshotter's copy path: on CPU, a copy on this thread
    t0 = time.perf_counter()
    copier.start(state)
    first_stall_s = time.perf_counter() - t0
    copier.finish()
    t0 = time.perf_counter()
    host = copier.start(state)         # every later snapshot writes over the previous copy
    stall_s = time.perf_counter() - t0
    copier.finish()
    store = SnapshotStore(memory_dir, "bench-snapshot", "localhost", bytes(32))
    t1 = time.perf_counter()
    data = serialize(host)
    store.save_own(0, 1000, {STATE_FILE: data}, {"world": 1, "rank": 0})
    background_s = time.perf_counter() - t1
    model = {key: torch.zeros_like(value) for key, value in state.items() if isinstance(value, torch.Tensor)}
    t2 = time.perf_counter()
    with store.open_verified(Copy(0, 1000, "localhost", True, 1), STATE_FILE) as own_copy:   # as a restore reads it
        restored = deserialize(own_copy)
    apply(model, restored)
    memory_restore_s = time.perf_counter() - t2
    assert torch.equal(model["weights"], state["weights"])
    manager = CheckpointManager(disk_dir / "ckpt")
    t3 = time.perf_counter()
    saved = manager.save(1000, lambda path: (path / STATE_FILE).write_bytes(data))
    disk_save_s = time.perf_counter() - t3
    cold = _drop_cache(saved.path / STATE_FILE)
    t4 = time.perf_counter()
    latest = manager.latest()
    assert latest is not None
    restored = deserialize((latest.path / STATE_FILE).read_bytes())
    apply(model, restored)
    disk_restore_s = time.perf_counter() - t4
    assert torch.equal(model["weights"], state["weights"])
    shutil.rmtree(store.root, ignore_errors=True)
    return {"stall_s": stall_s, "first_stall_s": first_stall_s, "background_s": background_s, "memory_restore_s": memory_restore_s,
            "disk_save_s": disk_save_s, "disk_restore_s": disk_restore_s, "cold": float(cold), "mb": len(data) / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state-mb", type=int, default=256)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--step-s", type=float, default=1.0)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    disk_dir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="slurmtools-snapshot-", dir="/var/tmp"))
    memory_dir = Path(tempfile.mkdtemp(prefix="slurmtools-snapshot-", dir="/dev/shm"))
    try:
        row = measure(args.state_mb, disk_dir, memory_dir)
    finally:
        shutil.rmtree(memory_dir, ignore_errors=True)
        if args.dir is None:
            shutil.rmtree(disk_dir, ignore_errors=True)
    overhead = row["stall_s"] / (args.every * args.step_s)
    print(f"state {row['mb']:.0f} MB: training stalls {row['stall_s'] * 1000:.0f} ms per snapshot (copy to host "
          f"memory, over the previous snapshot's copy; the first, allocating it, {row['first_stall_s'] * 1000:.0f} ms); "
          f"the background serializes, writes and seals it in {row['background_s']:.2f} s")
    print(f"restore from node memory {row['memory_restore_s']:.2f} s; from a checkpoint on disk "
          f"{row['disk_restore_s']:.2f} s ({'cold' if row['cold'] else 'page-cached'}; its save took "
          f"{row['disk_save_s']:.2f} s)")
    print(f"ratio memory-restore/disk-restore {row['memory_restore_s'] / row['disk_restore_s']:.2f}")
    print(f"overhead at one snapshot every {args.every} steps of {args.step_s:g} s: {100 * overhead:.2f}% "
          f"(goal <= 2%: {'met' if overhead <= 0.02 else 'not met'})")
    bounded = interval_for(row["stall_s"], args.step_s, args.every, DEFAULT_MAX_OVERHEAD_PCT)
    print(f"interval the default bound keeps (snapshot_max_overhead_pct {DEFAULT_MAX_OVERHEAD_PCT:g}): every "
          f"{bounded} steps, {100 * row['stall_s'] / (bounded * args.step_s):.2f}% of training time")
    peer = snapshot_peer.measure(args.state_mb)
    print(f"peer (two gloo ranks, loopback TCP): replicated {peer['replication_s']:.2f} s after the snapshot; "
          f"restore on a spare pulling from the replica {peer['peer_restore_s']:.2f} s (verified, loaded)")
    print(f"ratio peer-restore/disk-restore {peer['peer_restore_s'] / row['disk_restore_s']:.2f}")
    snapshot_goodput.report(stall_s=row["stall_s"], replication_s=peer["replication_s"], every=args.every,
                            step_s=args.step_s, peer_restore_s=peer["peer_restore_s"],
                            disk_restore_s=row["disk_restore_s"])


if __name__ == "__main__":
    main()
