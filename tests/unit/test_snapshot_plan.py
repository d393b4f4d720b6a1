"""Snapshots' pairing and restore plans (slurmtools/snapshot/rules.py): who keeps whose replica, and
which copy each rank of a restarted step restores from, or why the persistent checkpoint."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slurmtools.snapshot import rules as snapshot
from slurmtools.snapshot.rules import Copy, peer_of, plan_restore
from slurmtools.snapshot.wire import FIRST_ROUND_BYTES

TWO_BY_TWO = {0: "n1", 1: "n1", 2: "n2", 3: "n2"}
FOUR_NODES = {rank: f"n{rank // 2 + 1}" for rank in range(8)}


def test_each_rank_is_paired_with_its_position_on_the_next_node():
    assert [peer_of(rank, FOUR_NODES) for rank in range(8)] == [2, 3, 4, 5, 6, 7, 0, 1]
    assert [peer_of(rank, TWO_BY_TWO) for rank in range(4)] == [2, 3, 0, 1]
    assert all(FOUR_NODES[peer_of(rank, FOUR_NODES)] != FOUR_NODES[rank] for rank in range(8))


def test_one_node_has_no_peer_and_uneven_nodes_wrap_the_position():
    assert peer_of(0, {0: "n1", 1: "n1"}) is None
    uneven = {0: "n1", 1: "n1", 2: "n1", 3: "n2"}
    assert [peer_of(rank, uneven) for rank in range(4)] == [3, 3, 3, 0]
    assert snapshot.replicas_kept_by(3, uneven) == [0, 1, 2]


def test_nodes_are_ordered_by_their_lowest_rank_not_their_names():
    hosts = {0: "node10", 1: "node9", 2: "node10", 3: "node9"}
    assert snapshot.nodes_in_order(hosts) == ["node10", "node9"]
    assert peer_of(0, hosts) == 1 and peer_of(3, hosts) == 2


def _copies(step, hosts, *, own=True, replicas=True, lost=()):
    out = []
    for rank, host in hosts.items():
        if own and host not in lost:
            out.append(Copy(rank, step, host, True, len(hosts)))
        peer = peer_of(rank, hosts)
        if replicas and peer is not None and hosts[peer] not in lost:
            out.append(Copy(rank, step, hosts[peer], False, len(hosts)))
    return out


def test_all_nodes_alive_every_rank_reads_its_own_copy():
    plan = plan_restore(_copies(20, FOUR_NODES) + _copies(10, FOUR_NODES), FOUR_NODES, checkpoint_step=0)
    assert plan.step == 20 and plan.why == "snapshot of step 20"
    assert all(copy.own and copy.host == FOUR_NODES[rank] for rank, copy in plan.sources.items())
    assert plan.pulls(FOUR_NODES) == {}


def test_a_spare_replacing_a_lost_node_pulls_its_ranks_from_their_replicas():
    before = FOUR_NODES
    copies = _copies(20, before)
    after = {**before, 4: "spare", 5: "spare"}                  # n3 died: its copies are gone with it
    living = [c for c in copies if c.host != "n3"]
    plan = plan_restore(living, after, checkpoint_step=10)
    assert plan.step == 20
    assert plan.pulls(after) == {4: Copy(4, 20, "n4", False, 8), 5: Copy(5, 20, "n4", False, 8)}
    assert all(plan.sources[rank].own for rank in (0, 1, 2, 3, 6, 7))


def test_both_members_of_a_pair_lost_falls_back_to_the_checkpoint():
    copies = [c for c in _copies(20, FOUR_NODES) if c.host not in ("n2", "n3")]
    after = {**FOUR_NODES, 2: "s1", 3: "s1", 4: "s2", 5: "s2"}
    plan = plan_restore(copies, after, checkpoint_step=10)
    assert (plan.step, plan.sources) == (None, {})
    assert plan.why == "step 20: no copy of rank 2 and 1 more on a living node"


def test_an_incomplete_newest_snapshot_falls_back_to_the_older_one():
    newest = [c for c in _copies(30, FOUR_NODES) if c.of_rank != 5]      # rank 5's never sealed, nor its replica
    plan = plan_restore(newest + _copies(20, FOUR_NODES), FOUR_NODES, checkpoint_step=10)
    assert plan.step == 20


def test_a_checkpoint_as_new_as_the_snapshots_wins_and_a_changed_world_uses_it():
    plan = plan_restore(_copies(20, FOUR_NODES), FOUR_NODES, checkpoint_step=20)
    assert plan.step is None and plan.why == "the persistent checkpoint (step 20) is as new as every snapshot"
    fewer = {rank: host for rank, host in FOUR_NODES.items() if rank < 6}
    plan = plan_restore(_copies(20, FOUR_NODES), fewer, checkpoint_step=10)
    assert plan.step is None and plan.why == "the world changed (8 -> 6 ranks): snapshots are per rank"
    assert plan_restore([], FOUR_NODES, None).why == "no verified snapshot on the living nodes"


@pytest.mark.parametrize("name, parsed", [("rank3", (True, 3)), ("replica-of-rank12", (False, 12)),
                                          ("rank", None), ("rank3.tmp", None), ("replica-of-3", None)])
def test_copy_directory_names(name, parsed):
    assert snapshot.parse_copy_dir(name) == parsed


def test_the_job_key_names_the_job_and_its_control_dir():
    one, other = snapshot.job_key("123", Path("/a/ctl")), snapshot.job_key("123", Path("/b/ctl"))
    assert one.startswith("123-") and one != other and len(one) == len("123-") + 16
    assert snapshot.job_key("1/../x", Path("/a")).startswith("1_.._x-")


def test_a_snapshot_and_its_replicas_must_fit_the_ranks_share_of_node_memory_at_their_peak():
    """Issue 46: the budget counted two own copies and two replicas (4 GB here), not the host copy,
    the serialization buffer, the replicas received, nor the newest copy held until the oldest is
    pruned: 9 GB at the peak, all of it in the job's memory cgroup (/dev/shm too)."""
    assert snapshot.peak_bytes(10**9, [10**9]) == 9 * 10**9
    assert snapshot.over_limit(10**9, [10**9], None) is None
    assert snapshot.over_limit(10**9, [10**9], 9 * 10**9) is None
    assert snapshot.over_limit(10**9, [10**9], 4 * 10**9) is not None
    assert snapshot.over_limit(10**9, [10**9, 10**9], 9 * 10**9) == (
        "a snapshot of 1 GB and 2 replica(s) of 2 GB need 13 GB of node memory at a snapshot's peak (host copy, "
        "serialization, replicas received, 2 of each kept and the newest before the oldest is pruned), over this "
        "rank's 9 GB")


def test_the_interval_grows_to_a_multiple_of_the_set_one_when_a_snapshot_stalls_too_long():
    # 40 ms of stall at most 1% of 1-s steps: 4 steps would do, so every 10 stays
    assert snapshot.interval_for(0.04, 1.0, 10, 1.0) == 10
    # a GPU's 1-s device-to-host copy of a 17-GB shard, 1-s steps: 100 steps, at most 1%
    assert snapshot.interval_for(1.0, 1.0, 10, 1.0) == 100
    assert snapshot.interval_for(1.0, 1.0, 10, 2.0) == 50
    assert snapshot.interval_for(1.01, 1.0, 10, 1.0) == 110         # a multiple of 10: the same steps
    assert snapshot.interval_for(1.0, 1.0, 30, 1.0) == 120
    # off (0 %), or nothing measured: as set
    assert snapshot.interval_for(1.0, 1.0, 10, 0.0) == 10
    assert snapshot.interval_for(0.0, 1.0, 10, 1.0) == 10
    assert snapshot.interval_for(1.0, 0.0, 10, 1.0) == 10
    assert snapshot.interval_for(5.0, 1e-9, 1, 1.0) == snapshot.MAX_INTERVAL_STEPS


def test_the_timeline_begins_at_the_newest_attempt_that_began_from_the_checkpoint():
    # A took snapshots, B restored A's, B ended in silent data corruption, C began from the checkpoint
    records = [("9.0", None), ("9.0.1", 150), ("9.0.2", None)]
    assert snapshot.timeline(records) == frozenset({"9.0.2"})
    assert snapshot.timeline(records[:2]) == frozenset({"9.0", "9.0.1"})
    assert snapshot.timeline([]) == frozenset()


def _tagged(step, hosts, attempt):
    return [Copy(c.of_rank, c.step, c.host, c.own, c.world, attempt) for c in _copies(step, hosts)]


def test_a_restore_never_crosses_timelines():
    """After an attempt ended in SDC the next began from the checkpoint (step 100) and crashed at
    step 130, before the corrupt timeline's last snapshot step (150): the one after restores the
    new timeline's step 130, never the corrupt 150 (which, newest, it took before)."""
    copies = _tagged(150, TWO_BY_TWO, "9.0.1") + _tagged(130, TWO_BY_TWO, "9.0.2")
    plan = plan_restore(copies, TWO_BY_TWO, 100, frozenset({"9.0.2"}))
    assert plan.step == 130 and {copy.attempt for copy in plan.sources.values()} == {"9.0.2"}
    assert plan_restore(copies, TWO_BY_TWO, 100).step == 150          # without the lineage: the corrupt one
    only_old = plan_restore(_tagged(150, TWO_BY_TWO, "9.0.1"), TWO_BY_TWO, 100, frozenset({"9.0.2"}))
    assert (only_old.step, only_old.why) == (None, "8 snapshot copies of another timeline (taken before a restart "
                                                   "from the persistent checkpoint): never restored")


def test_a_rolled_back_run_never_jumps_forward_to_the_abandoned_timeline():
    assert snapshot.rolled_back(100, 250) == ("the newest checkpoint (step 100) is older than step 250, which the job "
                                             "recorded (rolled back by a person, or set aside as corrupt): the "
                                             "snapshots descend from a checkpoint that is gone")
    assert snapshot.rolled_back(None, 250) is not None
    assert snapshot.rolled_back(250, 250) is None and snapshot.rolled_back(300, 250) is None
    assert snapshot.rolled_back(None, None) is None


def _node_copies(node: int, ranks_per_node: int, world: int) -> list:
    """A node's copies at ranks_per_node ranks of a world-size job: each rank's own and the replica
    it keeps, at the KEEP newest steps, taken by one attempt."""
    first = node * ranks_per_node
    return [Copy(of_rank=rank if own else (rank - ranks_per_node) % world, step=step, host=f"node{node:04d}",
                 own=own, world=world, attempt="123456.17")
            for rank in range(first, first + ranks_per_node) for own in (True, False)
            for step in range(1_000_000 - 10 * (snapshot.KEEP - 1), 1_000_001, 10)]


def test_a_nodes_packed_copies_unpack_to_the_same_copies():
    copies = _node_copies(3, 2, 8) + [Copy(of_rank=0, step=4, host="other", own=True, world=2, attempt="")]
    packed = snapshot.pack_copies(copies)
    assert {name: packed[name] for name in ("step", "world", "host", "attempt")} == {
        "step": [4, 999_990, 1_000_000], "world": [2, 8], "host": ["node0003", "other"], "attempt": ["", "123456.17"]}
    assert packed["copies"][:2] == [[6, 1, 1, 1, 0, 1], [6, 1, 2, 1, 0, 1]]
    assert snapshot.unpack_copies(json.loads(json.dumps(packed))) == copies
    assert snapshot.unpack_copies(snapshot.pack_copies([])) == []


def test_eight_ranks_copies_at_9600_ranks_fit_the_collectives_first_round():
    """One round of the inventory at any world size: a node of 8 ranks (own and replica, KEEP
    steps) packs into the first round's 1 KiB with the leader's null beside it."""
    copies = _node_copies(1199, 8, 9600)
    assert len(copies) == 8 * 2 * snapshot.KEEP
    sent = json.dumps({"copies": snapshot.pack_copies(copies), "leader": None}, sort_keys=True).encode()
    assert len(sent) <= FIRST_ROUND_BYTES - 8
    assert snapshot.unpack_copies(json.loads(sent)["copies"]) == copies


_TABLES = {"step": [4], "world": [2], "host": ["n1"], "attempt": [""]}


@pytest.mark.parametrize("part, problem", [
    ([], "not an object of step, world, host, attempt and copies"),
    ({**_TABLES}, "not an object of step, world, host, attempt and copies"),
    ({**_TABLES, "host": "n1", "copies": []}, "host is not a list of strs"),
    ({**_TABLES, "attempt": [3], "copies": []}, "attempt is not a list of strs"),
    ({**_TABLES, "step": [True], "copies": []}, "step is not a list of ints"),
    ({**_TABLES, "copies": {}}, "copies is not a list"),
    ({**_TABLES, "copies": [[0, 1, 0, 0, 1, 0]]}, "copy [0, 1, 0, 0, 1, 0] is not"),
    ({**_TABLES, "copies": [[0, 1, 0, 0, 0, 1]]}, "copy [0, 1, 0, 0, 0, 1] is not"),
    ({**_TABLES, "copies": [[0, 1, 1, 0, 0, 0]]}, "copy [0, 1, 1, 0, 0, 0] is not"),
    ({**_TABLES, "copies": [[0, 2, 0, 0, 0, 0]]}, "copy [0, 2, 0, 0, 0, 0] is not"),
    ({**_TABLES, "copies": [[-1, 1, 0, 0, 0, 0]]}, "copy [-1, 1, 0, 0, 0, 0] is not"),
    ({**_TABLES, "copies": [[0, True, 0, 0, 0, 0]]}, "copy [0, True, 0, 0, 0, 0] is not"),
    ({**_TABLES, "copies": [[0, 1, 0, 0, 0]]}, "copy [0, 1, 0, 0, 0] is not"),
])
def test_a_packed_part_that_is_none_of_ours_is_named(part, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        snapshot.unpack_copies(part)
