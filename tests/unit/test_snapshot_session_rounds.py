"""A snapshot session opens, and a restore learns rank 0's decision, in as few collectives as they
can (a recovery in place pays each round at every rank; at 32 ranks on 2 cores ~0.1-0.2 s each),
for real, three gloo ranks: a restart (the job's key kept in its control dir) opens in one round;
a job's first start, where ranks may read before rank 0 made the key, in two at most and every
rank the same; the restore's inventory carries rank 0's word in its own round."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from slurmtools.common.job_secret import KEY_FILE
from tests.unit.test_flight_recorder import _free_port
from tests.unit.ranks import rank_argv

RANK_SCRIPT = r"""
import datetime, json, os, pathlib, sys, torch.distributed as dist
from slurmtools.snapshot import fsdp as snapshot_fsdp, torch_state
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rounds = []
for name in ("all_gather", "all_reduce", "broadcast"):
    real = getattr(dist, name)
    def counted(*args, _real=real, _name=name, **kwargs):
        rounds.append(_name)
        return _real(*args, **kwargs)
    setattr(dist, name, counted)
control = pathlib.Path(os.environ["CONTROL"])
session = snapshot_fsdp.Session.open(5, control, "9.0", dict(os.environ, SLURM_JOB_ID="9"))
opened = list(rounds)
rounds.clear()
copies, leader = torch_state.gather_inventory(session.snapshotter.store, session.snapshotter.group,
                                              {"from": dist.get_rank()},
                                              lists=torch_state.lists_node(dist.get_rank(), session.hosts))
print(json.dumps({"opened": session is not None, "open_rounds": opened, "inventory_rounds": list(rounds),
                  "leader": leader, "copies": len(copies)}))
session.exit(None, None, None)
dist.destroy_process_group()
"""


def _open(tmp_path) -> list:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="3",
               CONTROL=str(tmp_path / "control"), SLURMTOOLS_NODE_LOCAL_DIR=str(tmp_path / "memory"))
    procs = [subprocess.Popen(rank_argv(RANK_SCRIPT), env=dict(env, RANK=str(rank)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(3)]
    outs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 3, [err[-2000:] for _, err in outs]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


@pytest.fixture
def dirs(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "control").mkdir(mode=0o700)
    (tmp_path / "memory").mkdir(mode=0o700)
    return tmp_path


def test_a_restart_opens_its_session_in_one_round_and_a_first_start_in_two_at_most(dirs):
    first = _open(dirs)
    assert [rank["opened"] for rank in first] == [True] * 3
    assert len({tuple(rank["open_rounds"]) for rank in first}) == 1          # every rank the same collectives
    assert first[0]["open_rounds"] in (["all_gather"], ["all_gather", "all_reduce"])
    assert (dirs / "control" / KEY_FILE).is_file()                            # rank 0 made it
    again = _open(dirs)                      # the key kept: a requeue's or a recovery's session
    assert [rank["opened"] for rank in again] == [True] * 3
    assert [rank["open_rounds"] for rank in again] == [["all_gather"]] * 3


def test_the_restores_inventory_carries_rank_0s_decision_in_its_own_round(dirs):
    said = _open(dirs)
    assert [rank["leader"] for rank in said] == [{"from": 0}] * 3
    assert [rank["inventory_rounds"] for rank in said] == [["all_gather"]] * 3
    assert [rank["copies"] for rank in said] == [0] * 3


def test_one_rank_a_node_lists_its_copies_in_the_inventory():
    """The first rank of each node (in rank order, however the hosts interleave) lists the node's
    copies; its node's other ranks send none (the same node memory: test_snapshot_gloo restores
    from an inventory so listed, two ranks a node)."""
    pytest.importorskip("torch")
    from slurmtools.snapshot.torch_state import lists_node
    hosts = {0: "b", 1: "a", 2: "a", 3: "b", 4: "c"}
    assert [lists_node(rank, hosts) for rank in hosts] == [True, True, False, False, True]
