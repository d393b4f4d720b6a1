"""Hangs attributed to a node: a whole node behind (by step, or in the flight recorder), and a
GPU-side hang where every rank entered the collective but one node's entries never started."""
from slurmtools.common.ledger import Cause
from slurmtools.requeue import flightrec, watchdog
from slurmtools.requeue.policy import Evidence, classify
from tests.unit.test_flight_recorder import dump, entry, laggard

HOSTS = {0: "node1", 1: "node1", 2: "node2", 3: "node2", 4: "node3", 5: "node3"}


def test_a_whole_node_behind_in_the_flight_recorder_is_named():
    waiting = dump(entry(41), entry(42, "nccl:all_reduce", state="started"))
    behind = dump(entry(41))
    found = laggard({0: waiting, 1: waiting, 2: behind, 3: behind, 4: waiting, 5: waiting}, HOSTS)
    assert (found.rank, found.host, found.ranks, found.waiting) == (2, "node2", (2, 3), (0, 1, 4, 5))
    assert found.detail == ("ranks 2,3 on node2 never entered nccl:all_reduce #42 of process group 0 that ranks "
                            "0,1,4,5 wait in (flight recorder)")


def test_ranks_behind_on_two_nodes_name_nobody():
    waiting = dump(entry(41), entry(42, state="started"))
    behind = dump(entry(41))
    assert laggard({0: waiting, 1: behind, 2: behind, 3: waiting}, HOSTS) is None


def test_a_gpu_side_hang_is_named_from_the_entry_states():
    """Every rank entered all_reduce #42; node3's entries are still `scheduled` (its GPU never
    launched the kernel) while the others' `started` and wait for it."""
    started = dump(entry(41), entry(42, state="started"))
    scheduled = dump(entry(41), entry(42, state="scheduled"))
    dumps = {0: started, 1: started, 2: started, 3: started, 4: scheduled, 5: scheduled}
    found = laggard(dumps, HOSTS)
    assert (found.rank, found.host, found.ranks, found.never_started) == (4, "node3", (4, 5), True)
    assert found.detail == ("ranks 4,5 on node3 never started nccl:all_reduce #42 of process group 0 that ranks "
                            "0,1,2,3 started (flight recorder entry states)")
    one = laggard({0: started, 1: scheduled}, {0: "node1", 1: "node2"})      # one rank per side
    assert (one.rank, one.host) == (1, "node2")


def test_entry_states_that_name_no_single_node_name_nobody():
    started = dump(entry(42, state="started"))
    scheduled = dump(entry(42, state="scheduled"))
    assert laggard({0: started, 1: scheduled, 2: scheduled, 3: started, 4: started, 5: started},
                             HOSTS) is None                                      # node1 and node2 behind
    assert laggard({0: started, 1: started}, HOSTS) is None               # all the same: a deadlock
    odd = dump(entry(42, state="weird"))
    assert laggard({0: started, 1: odd}, {0: "node1", 1: "node2"}) is None  # an unknown state


def beat(rank, host, step, time_s=100.0):
    return watchdog.Beat(rank, host, step, time_s)


def test_a_whole_node_behind_by_step_is_the_laggard():
    beats = [beat(0, "node1", 9), beat(1, "node1", 9), beat(2, "node2", 8), beat(3, "node2", 8),
             beat(4, "node3", 9), beat(5, "node3", 9)]
    stall = watchdog.judge(beats, 200.0, 60)
    assert (stall.rank, stall.host, stall.step) == (2, "node2", 8)
    assert stall.detail == "ranks 2,3 on node2 stopped at step 8; the others went on"
    diag = classify(Evidence(exit_code=None, hang_detected=True, hang_rank=stall.rank, hang_node=stall.host,
                             hang_detail=stall.detail))
    assert (diag.cause, diag.node, diag.fatal_for_node) == (Cause.HANG, "node2", True)


def test_ranks_behind_on_two_nodes_by_step_name_nobody():
    beats = [beat(0, "node1", 9), beat(1, "node1", 8), beat(2, "node2", 8), beat(3, "node2", 9)]
    stall = watchdog.judge(beats, 200.0, 60)
    assert (stall.rank, stall.host) == (None, None)


PARTITION_BEATS = [watchdog.Beat(rank, HOSTS[rank], 6, 100.0) for rank in range(6)]
UNEXPLAINED = watchdog.Stall(30.0, None, None, 6)


def test_a_node_cut_off_from_the_others_is_named_when_its_slurmd_does_not_answer():
    """Every rank alive at step 6 (node2's still beat on the shared filesystem), node2's slurmd
    unreachable from the batch host: node2 is cut off, and the hang is its."""
    found = watchdog.cut_off(UNEXPLAINED, PARTITION_BEATS, ["node2"], 3)
    assert (found.rank, found.host, found.step) == (2, "node2", 6)
    assert found.detail == ("every rank stopped at step 6 and the slurmd of node2 does not answer: cut off from "
                            "the other nodes")
    assert found.cut_off == ("node2",)       # the supervisor takes it for lost, like a dead node
    diag = classify(Evidence(exit_code=None, dead_node=found.cut_off[0], dead_detail=found.detail, progressed=True))
    assert (diag.cause, diag.node, diag.fatal_for_node) == (Cause.NODE_FAILURE, "node2", True)


def test_no_node_is_named_when_every_slurmd_answers_or_most_do_not():
    assert watchdog.cut_off(UNEXPLAINED, PARTITION_BEATS, [], 3) == UNEXPLAINED
    assert watchdog.cut_off(UNEXPLAINED, PARTITION_BEATS, ["node2", "node3"], 3) == UNEXPLAINED   # we are cut off
    named = watchdog.Stall(30.0, 4, "node3", 5)
    assert watchdog.cut_off(named, PARTITION_BEATS, ["node2"], 3) == named                   # already explained
