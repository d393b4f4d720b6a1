"""In-memory snapshots for real: four gloo ranks standing for two nodes of two ranks (each "node" a
memory directory of its own), snapshots every 5 steps in the background, replicated to the peer
node; then node n2's memory is wiped (the node is lost) and a restart on n1 and a spare n3
restores every rank's exact state of step 10, ranks 2 and 3 pulled from their replicas on n1.
A corrupted replica and both nodes' loss fall back, saying why."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.unit.test_flight_recorder import _free_port
from tests.unit.ranks import rank_argv

RANK_SCRIPT = r"""
import datetime, json, os, pathlib, sys, torch, torch.distributed as dist
from slurmtools.snapshot.store import SnapshotStore
from slurmtools.snapshot import torch_state as snapshot_torch, wire as snapshot_wire
snapshot_wire.CHUNK_BYTES = 1000     # a ~4-KB state pulled in five chunks: the pipeline's two buffers reused
if os.environ.get("NODE_MEMORY_FULL"):   # node memory refuses the pull's file: received into process memory
    def _full(self, rank, size):
        raise OSError(28, "No space left on device")
    SnapshotStore.incoming = _full
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, hosts = dist.get_rank(), {int(k): v for k, v in json.loads(os.environ["HOSTS"]).items()}
# the job's key; a rank named in OUTSIDERS holds another (a process that joined the transport from outside the job)
key = bytes(32) if str(rank) in os.environ.get("OUTSIDERS", "").split(",") else bytes(range(32))
store = SnapshotStore(pathlib.Path(os.environ["MEMORY"]) / hosts[rank], "77-job", hosts[rank], key)
group = snapshot_torch.side_group()
if sys.argv[1] == "train":
    weights = torch.zeros(5000 if os.environ.get("BIG_RANK") == str(rank) else 1000) + rank
    limit = int(os.environ["LIMIT"]) if os.environ.get("LIMIT") else None
    overhead = float(os.environ.get("OVERHEAD") or 0)
    snaps = snapshot_torch.Snapshotter(store, rank, hosts, 5, group, limit_bytes=limit, max_overhead_pct=overhead)
    step_s = 1e-6 if rank == 0 else 1000.0      # rank 0's steps too short for any stall: it asks for a longer interval
    taken = []
    for step in range(1, 13):
        weights += step                     # the training: each step changes the state in place
        if snaps.due(step):
            taken.append(step)
            snaps.take(step, {"weights": weights, "step": step}, step_s=step_s)
    snaps.close()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    sharded = distribute_tensor(torch.zeros(8, 4), init_device_mesh("cpu", (dist.get_world_size(),)), [Shard(0)])
    print(json.dumps({"rank": rank, "failures": snaps.failures, "host_bytes": snaps.host_bytes(),
                      "taken": taken, "every": snaps.every_steps,
                      "dtensor_bytes": snapshot_torch.tensor_bytes({"w": sharded})}))
else:
    step, state, why = snapshot_torch.restore(store, rank, hosts, int(sys.argv[2]), group)
    expected = (torch.zeros(1000) + rank + sum(range(1, 11))).tolist()
    print(json.dumps({"rank": rank, "step": step, "why": why,
                      "exact": state is not None and state["weights"].tolist() == expected and state["step"] == 10}))
dist.destroy_process_group()
"""


def _run(tmp_path: Path, hosts: dict, *args: str, limit: str = "", memory_full: bool = False,
         big_rank: str = "", overhead: str = "", outsiders: str = "") -> list:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(len(hosts)),
               HOSTS=json.dumps(hosts), MEMORY=str(tmp_path / "memory"), LIMIT=limit,
               NODE_MEMORY_FULL="1" if memory_full else "", BIG_RANK=big_rank, OVERHEAD=overhead, OUTSIDERS=outsiders)
    procs = [subprocess.Popen(rank_argv(RANK_SCRIPT, *args), env=dict(env, RANK=str(rank)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in hosts]
    outs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * len(hosts), [err[-2000:] for _, err in outs]
    return [dict(json.loads(out.strip().splitlines()[-1]), stderr=err) for out, err in outs]


@pytest.fixture(scope="module")
def trained_once(tmp_path_factory):
    """One training run's node memories (four torch processes start in ~5 s here: once a module)."""
    pytest.importorskip("torch")
    base = tmp_path_factory.mktemp("snapshots")
    for node in ("n1", "n2", "n3"):
        (base / "memory" / node).mkdir(parents=True)
    results = _run(base, {0: "n1", 1: "n1", 2: "n2", 3: "n2"}, "train")
    assert [r["failures"] for r in results] == [[]] * 4
    assert [(r["taken"], r["every"]) for r in results] == [([5, 10], 5)] * 4      # no bound: every 5 steps
    assert [r["host_bytes"] for r in results] == [4000] * 4          # 1,000 float32 each, one copy kept
    assert [r["dtensor_bytes"] for r in results] == [32] * 4         # an 8x4 DTensor over 4 ranks: its 2x4 shard
    return base


@pytest.fixture
def trained(trained_once, tmp_path):
    """A copy of the trained nodes' memories, this test's own to wipe and corrupt."""
    shutil.copytree(trained_once / "memory", tmp_path / "memory", symlinks=True)
    return tmp_path


def _copies(tmp_path, node):
    root = next((tmp_path / "memory" / node).glob("slurmtools-*/snapshots/77-job"))
    return sorted(f"{d.name}/{s.name}" for d in root.iterdir() for s in d.iterdir())


def test_a_lost_node_is_restored_on_a_spare_from_its_replicas(trained):
    assert _copies(trained, "n1") == ["rank0/step_10", "rank0/step_5", "rank1/step_10", "rank1/step_5",
                                      "replica-of-rank2/step_10", "replica-of-rank2/step_5",
                                      "replica-of-rank3/step_10", "replica-of-rank3/step_5"]
    shutil.rmtree(trained / "memory" / "n2")              # the node and its memory are gone
    results = _run(trained, {0: "n1", 1: "n1", 2: "n3", 3: "n3"}, "restore", "4")
    assert [(r["step"], r["exact"]) for r in results] == [(10, True)] * 4
    assert results[0]["why"] == "snapshot of step 10, ranks 2,3 pulled from their replicas"
    # the pulls were received into files of the spare's node memory and loaded from them: gone now
    assert list((trained / "memory" / "n3").glob("slurmtools-*/snapshots/77-job/.incoming-*")) == []
    assert list((trained / "memory" / "n3").glob("slurmtools-*/snapshots/77-job")) != []


def test_a_pull_node_memory_cannot_hold_is_received_into_process_memory(trained):
    shutil.rmtree(trained / "memory" / "n2")
    results = _run(trained, {0: "n1", 1: "n1", 2: "n3", 3: "n3"}, "restore", "4", memory_full=True)
    assert [(r["step"], r["exact"]) for r in results] == [(10, True)] * 4
    assert results[0]["why"] == "snapshot of step 10, ranks 2,3 pulled from their replicas"
    said = [[line for line in r["stderr"].splitlines() if "received into process memory" in line] for r in results]
    assert [len(lines) for lines in said] == [0, 0, 1, 1], said          # the pullers say so, once each
    assert re.fullmatch(r"slurmtools: rank 2: a pull of \d+ bytes is received into process memory \(node memory "
                        r"has no room for it: .+\)", said[2][0]), said


def _lose_n2_and_corrupt(trained, copy_dir: str) -> None:
    """Node n2 lost, and one byte flipped in the step-10 state of n1's copy directory copy_dir."""
    shutil.rmtree(trained / "memory" / "n2")
    root = next((trained / "memory" / "n1").glob("slurmtools-*/snapshots/77-job"))
    state = root / copy_dir / "step_10" / "state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))


def test_a_corrupted_replica_falls_back_to_the_older_snapshot_or_the_checkpoint(trained):
    _lose_n2_and_corrupt(trained, "replica-of-rank3")
    results = _run(trained, {0: "n1", 1: "n1", 2: "n3", 3: "n3"}, "restore", "4")
    # step 10's replica of rank 3 fails the digest its manifest records as rank 3 pulls it: every
    # rank plans again without it
    refused = "snapshot of step 10 refused: rank 3: the replica of step 10 pulled from n1 does not match its digest"
    assert [r["step"] for r in results] == [5] * 4              # step 10 lacks rank 3: step 5 is whole
    assert results[0]["why"] == f"snapshot of step 5, ranks 2,3 pulled from their replicas ({refused})"
    results = _run(trained, {0: "n1", 1: "n1", 2: "n3", 3: "n3"}, "restore", "5")
    assert [(r["step"], r["why"]) for r in results] == [
        (None, f"{refused}; step 10: no copy of rank 3 on a living node")] * 4
    # rank 2's pull of step 10 arrived whole before rank 3's was refused: its file is not left behind
    assert list((trained / "memory" / "n3").glob("slurmtools-*/snapshots/77-job/.incoming-*")) == []


def test_a_rank_whose_own_copy_is_corrupted_still_serves_its_pull_and_all_plan_again(trained):
    """Rank 0's own copy of step 10 fails its digest, and rank 0 serves rank 2's pull of step 10:
    it serves it all the same (nobody waits for ever), and every rank plans again: step 5."""
    _lose_n2_and_corrupt(trained, "rank0")
    results = _run(trained, {0: "n1", 1: "n1", 2: "n3", 3: "n3"}, "restore", "4")
    assert [r["step"] for r in results] == [5] * 4
    why = results[0]["why"]
    assert why.startswith("snapshot of step 5, ranks 2,3 pulled from their replicas (snapshot of step 10 refused: "
                          "rank 0: snapshot ") and why.endswith("rank0/step_10: checksum mismatch in state.pt)"), why


def test_a_replica_sent_without_the_jobs_key_is_not_kept(tmp_path):
    """Rank 2 sends its replicas with a MAC under another key (a process outside the job that
    joined its transport, standing in for rank 2): rank 0, which keeps rank 2's replica, refuses
    each one and says so; its own copy, and every other replica, are kept. (Rank 2 refuses rank
    0's replicas alike: under its key they carry no MAC it knows.)"""
    for node in ("n1", "n2"):
        (tmp_path / "memory" / node).mkdir(parents=True)
    results = _run(tmp_path, {0: "n1", 1: "n1", 2: "n2", 3: "n2"}, "train", outsiders="2")
    def refused(of_rank: int) -> list:
        return [[step, f"CheckpointError: the replica of rank {of_rank}'s step {step} does not carry the job's MAC "
                       f"(sent by a process without the job's key, or spoiled on the wire): not kept"] for step in (5, 10)]
    assert [r["failures"] for r in results] == [refused(2), [], refused(0), []]
    assert _copies(tmp_path, "n1") == ["rank0/step_10", "rank0/step_5", "rank1/step_10", "rank1/step_5",
                                       "replica-of-rank3/step_10", "replica-of-rank3/step_5"]


def test_a_pull_served_without_the_jobs_key_is_refused(trained):
    """Node n2 is lost; ranks 2 and 3 pull their replicas from n1, whose ranks now hold another
    key (processes outside the job serving the pulls): the bytes match the digest sent with them,
    but not the job's MAC, so no pulled state is restored; n1's own copies need no MAC (node
    memory is the user's own)."""
    shutil.rmtree(trained / "memory" / "n2")
    results = _run(trained, {0: "n1", 1: "n1", 2: "n3", 3: "n3"}, "restore", "4", outsiders="0,1")
    assert [r["step"] for r in results] == [None] * 4
    assert [r["why"] for r in results] == [
        "snapshot of step 10 refused: rank 2: the replica of step 10 pulled from n1 does not carry the job's MAC; "
        "snapshot of step 5 refused: rank 2: the replica of step 5 pulled from n1 does not carry the job's MAC; "
        "step 10: no copy of rank 2 and 1 more on a living node"] * 4


def test_both_nodes_of_a_pair_lost_uses_the_checkpoint(trained):
    for node in ("n1", "n2"):
        shutil.rmtree(trained / "memory" / node)
        (trained / "memory" / node).mkdir()
    results = _run(trained, {0: "n1", 1: "n1", 2: "n3", 3: "n3"}, "restore", "4")
    assert [(r["step"], r["why"]) for r in results] == [(None, "no verified snapshot on the living nodes")] * 4


def test_snapshots_over_the_node_memory_limit_are_not_kept_and_training_goes_on(tmp_path):
    """Each rank's share is 10 KB: its ~4-KB state twice and its peer's twice do not fit; every
    rank keeps nothing, sends nothing and says why, once a snapshot."""
    for node in ("n1", "n2"):
        (tmp_path / "memory" / node).mkdir(parents=True)
    results = _run(tmp_path, {0: "n1", 1: "n1", 2: "n2", 3: "n2"}, "train", limit="10000")
    for result in results:
        assert [step for step, _ in result["failures"]] == [5, 10]
        assert all(why.startswith("CheckpointError: a snapshot of ") and why.endswith("over this rank's 1e-05 GB")
                   for _, why in result["failures"]), result
        assert result["host_bytes"] == 0, result
    assert not list((tmp_path / "memory").glob("*/slurmtools-*/snapshots/77-job/*/step_*"))


def test_one_ranks_snapshot_over_the_limit_is_skipped_by_every_rank_before_it_is_sent(tmp_path):
    """Rank 3's state is 20 KB, the others' 4 KB, each rank's share 60 KB: rank 3 (its snapshot:
    116 KB at the peak) and rank 1 (rank 3's replica: 100 KB) are over, ranks 0 and 2 (36 KB) are
    not. The ranks agree on it by the tensors' sizes before serializing, so every rank skips both
    snapshots and says whose is over."""
    for node in ("n1", "n2"):
        (tmp_path / "memory" / node).mkdir(parents=True)
    results = _run(tmp_path, {0: "n1", 1: "n1", 2: "n2", 3: "n2"}, "train", limit="60000", big_rank="3")
    skipped = ("CheckpointError: rank 1's snapshot or the replicas it keeps do not fit its share of node memory: "
               "every rank skips this one")
    peak = ("at a snapshot's peak (host copy, serialization, replicas received, 2 of each kept and the newest "
            "before the oldest is pruned), over this rank's 6e-05 GB")
    over = {1: f"CheckpointError: a snapshot of 4e-06 GB and 1 replica(s) of 2e-05 GB need 0.0001 GB of node memory {peak}",
            3: f"CheckpointError: a snapshot of 2e-05 GB and 1 replica(s) of 4e-06 GB need 0.000116 GB of node memory {peak}"}
    for result in results:
        assert result["failures"] == [[5, over.get(result["rank"], skipped)], [10, over.get(result["rank"], skipped)]]
    assert [r["host_bytes"] for r in results] == [0] * 4        # agreed before the host copy: none taken
    assert not list((tmp_path / "memory").glob("*/slurmtools-*/snapshots/77-job/*/step_*"))


def test_snapshots_are_spaced_out_when_one_would_stall_more_than_its_share_of_training(tmp_path):
    """At most 1% of training time: rank 0's steps (1 us) are far too short for any snapshot's stall,
    the others' (1,000 s) long enough for it. The ranks agree at the first snapshot (the largest
    interval any rank needs, a multiple of 5), so every rank skips step 10 alike."""
    for node in ("n1", "n2"):
        (tmp_path / "memory" / node).mkdir(parents=True)
    results = _run(tmp_path, {0: "n1", 1: "n1", 2: "n2", 3: "n2"}, "train", overhead="1")
    assert [r["failures"] for r in results] == [[]] * 4
    assert [r["taken"] for r in results] == [[5]] * 4
    every = {r["every"] for r in results}
    assert len(every) == 1 and min(every) > 10 and min(every) % 5 == 0, every


STALL_SCRIPT = r"""
import json, os, sys, time, torch.distributed as dist, datetime
from slurmtools.snapshot import torch_state as snapshot_torch, wire as snapshot_wire
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
group = snapshot_torch.side_group(timeout_s=3.0)
if dist.get_rank() == 0:
    t0 = time.monotonic()
    try:
        snapshot_wire.exchange(b"x" * 1000, 1, [1], group)
        result = "received"
    except Exception as exc:          # the peer never sent: given up after the group's timeout
        result = type(exc).__name__
    print(json.dumps({"result": result, "waited_s": time.monotonic() - t0}), flush=True)
else:
    time.sleep(12)                    # rank 1 failed to serialize: it never joins the exchange
    print(json.dumps({"result": "idle"}), flush=True)
"""


def test_a_peer_that_never_sends_its_snapshot_is_given_up_after_the_side_groups_timeout(tmp_path):
    """One rank failing to serialize left its peer waiting the collective timeout (30 minutes)."""
    pytest.importorskip("torch")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2")
    procs = [subprocess.Popen(rank_argv(STALL_SCRIPT), env=dict(env, RANK=str(rank)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outs = [proc.communicate(timeout=120) for proc in procs]
    first = json.loads(outs[0][0].strip().splitlines()[-1])
    assert first["result"] != "received" and 2.5 <= first["waited_s"] < 11, (first, outs[0][1][-2000:])
    from slurmtools.snapshot.torch_state import EXCHANGE_TIMEOUT_S
    assert EXCHANGE_TIMEOUT_S == 120.0
