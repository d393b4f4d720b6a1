#!/usr/bin/env python3
"""A peer restore for real, for bench/snapshot.py: two gloo ranks stand for two nodes, each with a
node memory directory of its own. Both take a snapshot of --state-mb (snapshot_torch.Snapshotter:
each replicates to the other, as two nodes of a ring do); then node "a" is lost: rank 0 goes on as
a spare "c" with empty memory and restores through snapshot_torch.restore, pulling its state from
the replica rank 1 keeps. Prints the replication time (a snapshot taken to both copies sealed) and
the restore time on the spare (the collective, the pull, the digest check, loading, copying into
the trainer's tensor).

    .venv/bin/python bench/snapshot_peer.py [--state-mb 256]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict

REPO = Path(__file__).resolve().parents[1]

RANK_SCRIPT = r"""
import datetime, json, os, pathlib, sys, time, torch, torch.distributed as dist
from slurmtools.snapshot.store import SnapshotStore
from slurmtools.snapshot import torch_state as snapshot_torch
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
rank, memory, mb = dist.get_rank(), pathlib.Path(os.environ["MEMORY"]), int(os.environ["STATE_MB"])
before, after = {0: "a", 1: "b"}, {0: "c", 1: "b"}
group = snapshot_torch.side_group()
torch.manual_seed(rank)
state = {"weights": torch.randn(mb * 1024 * 1024 // 4), "step": 10}
snaps = snapshot_torch.Snapshotter(SnapshotStore(memory / before[rank], "bench", before[rank], bytes(32)), rank, before, 10, group)
t0 = time.perf_counter()
snaps.take(10, state)
snaps.wait()
replication_s = time.perf_counter() - t0
assert not snaps.failures, snaps.failures
model = torch.zeros_like(state["weights"])     # the trainer's own tensor the restore copies into
dist.barrier()
t1 = time.perf_counter()
step, restored, why = snapshot_torch.restore(SnapshotStore(memory / after[rank], "bench", after[rank], bytes(32)), rank, after,
                                             None, group)
if restored is not None:
    model.copy_(restored["weights"])
restore_s = time.perf_counter() - t1
exact = restored is not None and torch.equal(model, state["weights"])
print(json.dumps({"rank": rank, "replication_s": replication_s, "restore_s": restore_s, "why": why, "exact": exact}))
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def measure(state_mb: int) -> Dict[str, float]:
    """Replication and the spare's restore time, in seconds (the slower rank's replication)."""
    memory = Path(tempfile.mkdtemp(prefix="slurmtools-snapshot-peer-", dir="/dev/shm"))
    try:
        for node in ("a", "b", "c"):
            (memory / node).mkdir()
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2",
                   MEMORY=str(memory), STATE_MB=str(state_mb), PYTHONPATH=str(REPO))
        procs = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT], env=dict(env, RANK=str(rank)),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
        outs = [proc.communicate(timeout=600) for proc in procs]
        if any(proc.returncode for proc in procs):
            raise SystemExit("bench/snapshot_peer.py: a rank failed: " + " | ".join(err[-500:] for _, err in outs))
        rows = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    finally:
        shutil.rmtree(memory, ignore_errors=True)
    spare = rows[0]
    if not spare["exact"] or "pulled" not in spare["why"]:
        raise SystemExit(f"bench/snapshot_peer.py: the spare did not restore its exact state from the replica: {spare['why']}")
    return {"replication_s": max(row["replication_s"] for row in rows), "peer_restore_s": spare["restore_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state-mb", type=int, default=256)
    args = ap.parse_args()
    row = measure(args.state_mb)
    print(f"state {args.state_mb} MB: replicated {row['replication_s']:.2f} s after the snapshot; the spare's "
          f"restore from the replica {row['peer_restore_s']:.2f} s")


if __name__ == "__main__":
    main()
