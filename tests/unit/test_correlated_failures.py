"""Several nodes lost at once leave the step together; a node that never beat is probed; the node
watch runs without spares; Slurm's NOT_RESPONDING is evidence. Pure rules, and the node watch's
logic with its slurmd probe replaced (the real probe is a TCP connect, tested on the cluster)."""
import time

import pytest

from slurmtools.common.ledger import Cause
from slurmtools.requeue import nodecheck, watchdog
from slurmtools.requeue.policy import Action, Capacity, Diagnosis, Evidence, classify, decide
from slurmtools.requeue.topology import Topology, topology_of
from slurmtools.spec import RequeueSpec

LIMITS = RequeueSpec(backoff_s=5.0)


def two_dead():
    return classify(Evidence(exit_code=None, dead_node="node3", dead_also=("node2",),
                             dead_detail="node node3: every rank silent for 10.2 s"))


def test_nodes_lost_together_are_one_diagnosis():
    diag = two_dead()
    assert (diag.cause, diag.node, diag.also_nodes, diag.fatal_for_node) == (Cause.NODE_FAILURE, "node3", ("node2",),
                                                                             True)


def test_two_dead_nodes_leave_for_two_spares_together():
    topology = Topology(("node1", "node2", "node3", "node4", "node5"), 3, 3)     # two spares
    capacity = Capacity(True, frozenset({"node2", "node3"}), topology.slack([]))
    verdict = decide(two_dead(), [], LIMITS, 8, capacity, now_s=1.0)
    assert (verdict.action, verdict.excluded, verdict.drained, verdict.backoff_s) == (
        Action.RESTART, ("node3", "node2"), ("node3", "node2"), 0.0)


def test_two_dead_nodes_with_one_spare_requeue_excluding_both():
    topology = Topology(("node1", "node2", "node3", "node4"), 3, 3)               # one spare
    assert topology.slack([]) == 1
    capacity = Capacity(True, frozenset({"node2", "node3"}), topology.slack([]))
    verdict = decide(two_dead(), [], LIMITS, 8, capacity, now_s=1.0)
    assert (verdict.action, verdict.excluded, verdict.drained) == (Action.REQUEUE, ("node3", "node2"),
                                                                   ("node3", "node2"))


def test_fewer_nodes_where_min_nodes_allows_both():
    topology = topology_of(["node1", "node2", "node3", "node4"], RequeueSpec(min_nodes=2))
    assert (topology.train_nodes, topology.slack([])) == (4, 2)
    assert topology.pick(["node2", "node3"]) == ["node1", "node4"]
    assert topology.slack(["node1"]) == 0                        # the batch host lost: nothing goes on


def test_without_spares_a_dead_node_is_a_requeue_excluding_it_at_once():
    diag = classify(Evidence(exit_code=None, dead_node="node2", dead_detail="node node2: every rank silent"))
    verdict = decide(diag, [], LIMITS, 4, Capacity(True, frozenset(), 0), now_s=1.0)
    assert (verdict.action, verdict.excluded, verdict.drained) == (Action.REQUEUE, ("node2",), ("node2",))


def test_not_responding_is_evidence_of_a_node_failure():
    diag = classify(Evidence(exit_code=1, node_states={"node1": "allocated", "node2": "not_responding",
                                                       "node3": "down"},
                             log_tail="gloo: Connection closed by peer\n"))
    assert (diag.cause, diag.node, diag.also_nodes) == (Cause.NODE_FAILURE, "node2", ("node3",))


# recorded in the fault matrix (test c): Slurm found node2 dead before the supervisor did and
# ended the run with SIGTERM, node2 not yet marked down
SLURM_ENDED_FOR_A_NODE = ("srun: error: Node failure on node2\n"
                          "slurmstepd-node1: error: *** JOB 200004 ON node1 CANCELLED AT 2026-12-02T06:01:12 DUE TO "
                          "NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***\n"
                          "srun: error: node3: task 2: Terminated\n")


def test_slurms_sigterm_for_a_node_failure_is_no_preemption():
    diag = classify(Evidence(exit_code=143, warning_received=True, log_tail=SLURM_ENDED_FOR_A_NODE,
                             node_states={"node1": "allocated", "node2": "allocated", "node3": "allocated"}))
    assert (diag.cause, diag.node) == (Cause.NODE_FAILURE, "node2")


def test_a_warning_that_ends_a_run_cleanly_is_a_preemption_even_with_a_node_failure_line():
    diag = classify(Evidence(exit_code=0, warning_received=True, log_tail=SLURM_ENDED_FOR_A_NODE))
    assert diag.cause is Cause.PREEMPTED


class FakeWatch(nodecheck.NodeWatch):
    """The node watch with its slurmd probe answered from a table."""

    def __init__(self, dead_nodes, *args, controller=True):
        super().__init__(*args)
        self.dead_nodes = set(dead_nodes)
        self.reprobe_after_s = 0.01
        self.controller_answers = lambda: controller

    def answers(self, node):
        return node not in self.dead_nodes


def beat(rank, host, alive):
    return watchdog.Beat(rank, host, 5, alive, None, alive)


def settle(watch, beats, now):
    """dead() until the probes in flight are done (they run in threads)."""
    for _ in range(100):
        found = watch.dead(beats, now)
        if found is not None or not watch.probes:
            return found
        time.sleep(0.01)
    pytest.fail("probes never finished")


def test_the_watch_finds_every_dead_node_of_the_step_together():
    """node3 is silent past the timeout; node2 died a moment later (still within the timeout) but
    its slurmd does not answer either: both leave together, once node3's second probe failed too."""
    nodes = ["node1", "node2", "node3", "node4", "node5"]
    watch = FakeWatch({"node2", "node3"}, 10, nodes, "node1", 100.0)
    try:
        beats = [beat(0, "node1", 129.0), beat(1, "node2", 125.0), beat(2, "node3", 118.0), beat(3, "node4", 129.0),
                 beat(4, "node5", 129.0)]
        assert settle(watch, beats, 130.0) is None                   # one failed probe proves little
        death = settle(watch, beats, 132.0)
        assert death == nodecheck.Death(("node3", "node2"), 14.0, 10.0)
    finally:
        watch.close()


def test_a_node_that_never_beat_is_probed_after_the_timeout_since_the_launch():
    watch = FakeWatch({"node3"}, 10, ["node1", "node2", "node3"], "node1", 100.0)
    try:
        beats = [beat(0, "node1", 109.0), beat(1, "node2", 109.0)]
        assert settle(watch, beats, 109.0) is None                   # 9 s after the launch: not yet
        assert settle(watch, beats, 111.0) is None                   # the first failed probe
        death = settle(watch, beats, 113.0)
        assert death is not None and death.nodes == ("node3",) and death.silent_s == 13.0
    finally:
        watch.close()


def test_a_silent_node_whose_slurmd_answers_is_not_dead():
    watch = FakeWatch(set(), 10, ["node1", "node2"], "node1", 100.0)
    try:
        assert settle(watch, [beat(0, "node1", 129.0), beat(1, "node2", 100.0)], 130.0) is None
        assert watch.probed_at == {"node2": 130.0}
    finally:
        watch.close()


def test_the_batch_host_is_never_declared_dead_by_its_own_supervisor():
    watch = FakeWatch({"node1"}, 10, ["node1", "node2"], "node1", 100.0)
    try:
        assert settle(watch, [beat(0, "node1", 100.0), beat(1, "node2", 129.0)], 130.0) is None
    finally:
        watch.close()


class FlakyWatch(FakeWatch):
    """node2's slurmd misses one connect, then answers."""

    def __init__(self, *args):
        super().__init__(set(), *args)
        self.misses = {"node2": 1}

    def answers(self, node):
        if self.misses.get(node):
            self.misses[node] -= 1
            return False
        return True


def test_one_missed_connect_is_no_death_and_an_answer_starts_the_count_again():
    watch = FlakyWatch(10, ["node1", "node2", "node3"], "node1", 100.0)
    try:
        beats = [beat(0, "node1", 129.0), beat(1, "node2", 100.0), beat(2, "node3", 129.0)]
        assert settle(watch, beats, 130.0) is None and watch.failed_since == {"node2": 130.0}
        assert settle(watch, beats, 132.0) is None and watch.failed_since == {}
    finally:
        watch.close()


@pytest.mark.parametrize("controller, dead", [(False, False), (True, True)])
def test_a_majority_of_the_job_unreachable_is_named_only_when_the_controller_answers(controller, dead):
    """A blip at the batch host: every other node's slurmd looks gone, and so is the controller.
    Nobody is declared dead (the job would exclude itself whole). With the controller answering
    our network is sound: the nodes are gone (two of a job of three killed at once, the fault matrix)."""
    nodes = ["node1", "node2", "node3", "node4"]
    watch = FakeWatch({"node2", "node3", "node4"}, 10, nodes, "node1", 100.0, controller=controller)
    try:
        beats = [beat(0, "node1", 129.0)] + [beat(i, n, 100.0) for i, n in enumerate(nodes[1:], 1)]
        assert settle(watch, beats, 130.0) is None
        death = settle(watch, beats, 132.0)
        assert (death is not None) is dead
        assert death is None or death.nodes == ("node2", "node3", "node4")
    finally:
        watch.close()


@pytest.mark.parametrize("controller, dead", [(True, True), (False, False)])
def test_in_a_job_of_two_the_controller_witnesses_that_our_network_is_sound(controller, dead):
    watch = FakeWatch({"node2"}, 10, ["node1", "node2"], "node1", 100.0, controller=controller)
    try:
        beats = [beat(0, "node1", 129.0), beat(1, "node2", 100.0)]
        assert settle(watch, beats, 130.0) is None
        death = settle(watch, beats, 132.0)
        assert (death is not None) is dead
    finally:
        watch.close()


@pytest.mark.parametrize("unreachable, job_nodes, controller, lost", [
    (["n2"], 3, False, True),              # a minority: lost, the controller not asked
    (["n2", "n3"], 5, False, True),
    (["n2", "n3"], 4, False, False),       # half the job and no controller: our own network, nobody named
    (["n2", "n3"], 3, True, True),         # the controller answers: they are gone
    (["n2"], 2, True, True),               # a job of two
    (["n2"], 2, False, False),
    ([], 3, True, False),
])
def test_lost_for_sure(unreachable, job_nodes, controller, lost):
    def ask():
        if 2 * len(unreachable) < job_nodes:
            raise AssertionError("the controller is asked only where the minority rule cannot decide")
        return controller
    assert watchdog.lost_for_sure(unreachable, job_nodes, ask) is lost


# the GPU fault of a rank: its XID only in node3's kernel log; the site's health check drained node3
GPU_FAULT_TAIL = ("[rank2]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
                  "srun: error: node3: task 2: Exited with exit code 1\n"
                  "srun: error: node2: task 1: Exited with exit code 1\n")


def test_a_node_drained_while_the_step_ran_is_blamed_and_replaced_not_drained_again():
    diag = classify(Evidence(exit_code=1, log_tail=GPU_FAULT_TAIL, progressed=True,
                             node_states={"node1": "allocated", "node2": "drained", "node3": "drained"}))
    assert (diag.cause, diag.node, diag.also_nodes, diag.fatal_for_node) == (Cause.NODE_FAILURE, "node3", ("node2",),
                                                                             False)
    topology = Topology(("node1", "node2", "node3", "node4", "node5"), 3, 3)
    verdict = decide(diag, [], LIMITS, 8, Capacity(True, frozenset({"node2", "node3"}), topology.slack([])), now_s=1.0)
    assert (verdict.action, verdict.excluded, verdict.drained) == (Action.RESTART, ("node3", "node2"), ())


def test_without_a_drained_node_the_same_failure_stays_a_crash():
    diag = classify(Evidence(exit_code=1, log_tail=GPU_FAULT_TAIL, progressed=True,
                             node_states={"node1": "allocated", "node2": "allocated", "node3": "allocated"}))
    assert (diag.cause, diag.node) == (Cause.CRASH, None)


def test_the_first_failed_task_names_its_node():
    from slurmtools.requeue.output_signs import first_failed_node
    assert first_failed_node(GPU_FAULT_TAIL) == "node3"
    assert first_failed_node("srun: error: node7: tasks 0-3: Killed\n") == "node7"
    assert first_failed_node("all well\n") is None


def test_slurms_drain_flag_reads_as_drained_unless_down_or_not_responding(monkeypatch):
    from slurmtools.slurm import commands as slurm
    from slurmtools.requeue import slurm_view
    from slurmtools.slurm.parse import NodeInfo

    def info(name, state, flags):
        return NodeInfo(name, state, flags, "", "", "", "")
    monkeypatch.setattr(slurm, "nodes", lambda names=None: [
        info("node1", "allocated", ()), info("node2", "allocated", ("DRAIN",)),
        info("node3", "down", ("DRAIN",)), info("node4", "allocated", ("DRAIN", "NOT_RESPONDING"))])
    monkeypatch.setattr(slurm, "slurmd_endpoints", lambda hostlist: {})   # no address: Slurm's word stands
    assert slurm_view.node_states("node[1-4]") == {"node1": "allocated", "node2": "drained", "node3": "down",
                                                   "node4": "not_responding"}


def test_not_responding_is_evidence_only_when_our_probes_get_no_answer_either(monkeypatch):
    """One missed ping of a loaded node (Slurm's NOT_RESPONDING) whose slurmd answers us is no node
    failure; a flagged node whose slurmd answers neither probe is. Real sockets on this machine."""
    import socket
    from slurmtools.slurm import commands as slurm
    from slurmtools.requeue import nodecheck, slurm_view
    from slurmtools.slurm.parse import NodeInfo

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(8)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()                     # nothing listens there: the connect is refused
    endpoints = {"node1": ("127.0.0.1", listening.getsockname()[1]), "node2": ("127.0.0.1", closed_port)}
    monkeypatch.setattr(nodecheck, "CONFIRM_GAP_S", 0.1)
    monkeypatch.setattr(slurm, "nodes", lambda names=None: [
        NodeInfo("node1", "allocated", ("NOT_RESPONDING",), "", "", "", ""),
        NodeInfo("node2", "allocated", ("NOT_RESPONDING",), "", "", "", ""),
        NodeInfo("node3", "allocated", (), "", "", "", "")])
    asked = []
    monkeypatch.setattr(slurm, "slurmd_endpoints", lambda hostlist: asked.append(hostlist) or endpoints)
    try:
        states = slurm_view.node_states("node[1-3]")
    finally:
        listening.close()
    assert states == {"node1": "allocated", "node2": "not_responding", "node3": "allocated"}
    assert asked == ["node1,node2"]          # only the flagged nodes are probed
    diag = classify(Evidence(exit_code=1, node_states=states, log_tail="Traceback\nValueError: bad batch\n"))
    assert (diag.cause, diag.node) == (Cause.NODE_FAILURE, "node2")
