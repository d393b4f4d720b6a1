"""Recovery inside the allocation: which nodes a step runs on, the step's command line, the
decision to restart in place, and node death from heartbeats. All pure."""
import pytest

from slurmtools.common.control_dir import attempt_number
from slurmtools.common.ledger import AttemptRecord, Cause
from slurmtools.requeue import watchdog
from slurmtools.requeue.policy import Action, Capacity, Diagnosis, Evidence, classify, decide
from slurmtools.requeue.topology import step_argv, topology_of
from slurmtools.spec import RequeueSpec

LIMITS = RequeueSpec(max_restarts=3, max_consecutive_failures=2, no_progress_restarts=3, backoff_s=5.0)
ALLOC = ["node1", "node2", "node3", "node4"]
IN_PLACE = Capacity(True, frozenset({"node2", "node3"}))


def test_spares_are_the_allocation_tail_and_replace_a_lost_node_in_order():
    topo = topology_of(ALLOC, RequeueSpec(spare_nodes=1))
    assert (topo.train_nodes, topo.min_nodes, topo.batch_host) == (3, 3, "node1")
    assert topo.pick([]) == ["node1", "node2", "node3"] and topo.spares([]) == ["node4"]
    assert topo.pick(["node2"]) == ["node1", "node3", "node4"] and topo.spares(["node2"]) == []
    assert topo.pick(["node2", "node3"]) is None            # no spare left, fewer nodes not allowed
    assert topo.can_lose("node3", []) and not topo.can_lose("node3", ["node2"])


def test_the_batch_host_is_never_lost_in_place():
    topo = topology_of(ALLOC, RequeueSpec(spare_nodes=2))
    assert not topo.can_lose("node1", []) and topo.pick(["node1"]) is None


def test_min_nodes_lets_the_job_go_on_with_fewer():
    topo = topology_of(ALLOC, RequeueSpec(min_nodes=2))
    assert topo.pick(["node4"]) == ["node1", "node2", "node3"]
    assert topo.pick(["node4", "node3"]) == ["node1", "node2"]
    assert topo.pick(["node4", "node3", "node2"]) is None


def test_without_spares_or_min_nodes_nothing_can_be_lost():
    topo = topology_of(ALLOC, RequeueSpec())
    assert not topo.can_lose_any([]) and topo.pick([]) == ALLOC


def test_step_argv_sets_the_nodes_of_srun_and_torchrun():
    argv = ["srun", "--kill-on-bad-exit=1", "--nodes=4", "--ntasks-per-node=1", "python3", "-m",
            "torch.distributed.run", "--nnodes=4", "train.py", "--nnodes=9"]
    assert step_argv(argv, ["node1", "node3", "node4"]) == [
        "srun", "--nodelist=node1,node3,node4", "--kill-on-bad-exit=1", "--nodes=3", "--ntasks-per-node=1",
        "python3", "-m", "torch.distributed.run", "--nnodes=3", "train.py", "--nnodes=9"]


def test_step_argv_adds_nodes_and_replaces_an_old_nodelist():
    assert step_argv(["/usr/bin/srun", "--nodelist=a,b", "prog"], ["a"]) == [
        "/usr/bin/srun", "--nodelist=a", "--nodes=1", "prog"]
    assert step_argv(["bash", "run.sh"], ["a"]) == ["bash", "run.sh"]
    assert step_argv(["srun", "prog"], ["a"], overlap=True) == ["srun", "--nodelist=a", "--overlap", "--nodes=1", "prog"]
    assert step_argv(["srun", "prog"], []) == ["srun", "prog"]


@pytest.mark.parametrize("diag,capacity,action,exclude,drain,backoff", [
    (Diagnosis(Cause.CRASH, detail="exit 1"), IN_PLACE, Action.RESTART, None, None, 5.0),
    (Diagnosis(Cause.COLLECTIVE_TIMEOUT), IN_PLACE, Action.RESTART, None, None, 5.0),
    (Diagnosis(Cause.HANG), IN_PLACE, Action.RESTART, None, None, 5.0),
    (Diagnosis(Cause.CRASH), Capacity(), Action.REQUEUE, None, None, 5.0),
    # a blamed node the allocation can do without: restart without it at once
    (Diagnosis(Cause.NODE_FAILURE, "node2", fatal_for_node=True), IN_PLACE, Action.RESTART, "node2", "node2", 0.0),
    (Diagnosis(Cause.HANG, "node3", fatal_for_node=True), IN_PLACE, Action.RESTART, "node3", "node3", 0.0),
    (Diagnosis(Cause.GPU_FATAL, "node2", fatal_for_node=True), IN_PLACE, Action.RESTART, "node2", "node2", 0.0),
    # a node it cannot do without (the batch host, no spare left): requeue excluding it
    (Diagnosis(Cause.NODE_FAILURE, "node1", fatal_for_node=True), IN_PLACE, Action.REQUEUE, "node1", "node1", 5.0),
    (Diagnosis(Cause.NODE_FAILURE, "node2"), Capacity(True), Action.REQUEUE, "node2", None, 5.0),
])
def test_decide_in_place(diag, capacity, action, exclude, drain, backoff):
    verdict = decide(diag, [], LIMITS, 4, capacity)
    assert (verdict.action, verdict.exclude_node, verdict.drain_node, verdict.backoff_s, verdict.counted) == (
        action, exclude, drain, backoff, True)


def test_in_place_off_sends_every_failure_through_requeue():
    verdict = decide(Diagnosis(Cause.CRASH), [], RequeueSpec(in_allocation=False), 4, IN_PLACE)
    assert verdict.action is Action.REQUEUE


def test_restarts_in_place_and_requeues_share_one_budget():
    history = [AttemptRecord(Cause.CRASH, True, 4), AttemptRecord(Cause.HANG, True, 8),
               AttemptRecord(Cause.COLLECTIVE_TIMEOUT, True, 12)]
    verdict = decide(Diagnosis(Cause.CRASH), history, LIMITS, 16, IN_PLACE)
    assert verdict.action is Action.STOP and "restart budget spent (3 failures within 6 h)" in verdict.reason


def test_the_same_failure_twice_in_a_row_stops_in_place_too():
    verdict = decide(Diagnosis(Cause.CRASH, detail="exit 1"), [AttemptRecord(Cause.CRASH, True, 4)], LIMITS, 4,
                     IN_PLACE)
    assert verdict.action is Action.STOP and "crash 2 times in a row" in verdict.reason


def test_preemption_and_user_errors_never_restart_in_place():
    assert decide(Diagnosis(Cause.PREEMPTED), [], LIMITS, 4, IN_PLACE).action is Action.REQUEUE
    assert decide(Diagnosis(Cause.USER_ERROR), [], LIMITS, 4, IN_PLACE).action is Action.STOP


def test_a_dead_node_found_by_the_supervisor_is_a_node_failure_to_drain():
    diag = classify(Evidence(exit_code=None, dead_node="node2", dead_detail="node node2: every rank silent"))
    assert (diag.cause, diag.node, diag.fatal_for_node, diag.detail) == (
        Cause.NODE_FAILURE, "node2", True, "node node2: every rank silent")


def beat(rank, host, alive, step=5, time_s=100.0):
    return watchdog.Beat(rank, host, step, time_s, None, alive)


def test_silent_nodes_are_those_whose_every_rank_is_silent():
    beats = [beat(0, "node1", 130.0), beat(1, "node1", 131.0), beat(2, "node2", 118.0), beat(3, "node2", 131.0),
             beat(4, "node3", 112.0), beat(5, "node3", 115.0)]
    nodes = ["node1", "node2", "node3"]
    assert watchdog.silent_step_nodes(beats, nodes, 90.0, 131.0, 10.0) == [("node3", 16.0)]
    assert watchdog.silent_step_nodes(beats, nodes, 90.0, 131.0, 0) == []
    assert [host for host, _ in watchdog.silent_step_nodes(beats, nodes, 90.0, 200.0, 10.0)] == [
        "node3", "node1", "node2"]                                           # ties by name
    # a node of the step none of whose ranks ever beat is silent since the launch (90.0)
    assert watchdog.silent_step_nodes(beats, [*nodes, "node4"], 90.0, 131.0, 10.0) == [("node4", 41.0),
                                                                                          ("node3", 16.0)]
    assert watchdog.silent_step_nodes(beats, ["node1"], 90.0, 131.0, 10.0) == []    # other hosts: not the step's


def test_a_rank_without_the_alive_field_is_alive_when_it_last_stepped():
    assert beat(0, "n", None, time_s=50.0).last_alive_s == 50.0


def test_node_timeout_is_four_median_steps_and_at_least_ten_seconds():
    assert watchdog.node_timeout_s(30, [1.0]) == 30.0
    assert watchdog.node_timeout_s(0, []) == 10.0
    assert watchdog.node_timeout_s(0, [0.5, 0.6, 0.7]) == 10.0
    assert watchdog.node_timeout_s(0, [4.0, 5.0, 60.0]) == 20.0


def test_heartbeat_alive_and_attempt_are_parsed_and_checked():
    good = watchdog.parse_heartbeat({"rank": 1, "step": 3, "time": 10.0, "alive": 12.0, "attempt_id": "7.0.1"}, 20.0)
    assert good is not None and (good.alive_s, good.attempt_id) == (12.0, "7.0.1")
    assert watchdog.parse_heartbeat({"rank": 1, "step": 3, "time": 10.0, "alive": "soon"}, 20.0) is None
    assert watchdog.parse_heartbeat({"rank": 1, "step": 3, "time": 10.0, "alive": 1e12}, 20.0) is None


def test_attempt_number_comes_from_the_supervisor_else_the_restart_count():
    assert attempt_number({"SLURMTOOLS_ATTEMPT_NUMBER": "3", "SLURM_RESTART_COUNT": "1"}) == 3
    assert attempt_number({"SLURM_RESTART_COUNT": "2"}) == 2
    assert attempt_number({"SLURMTOOLS_ATTEMPT_NUMBER": "x"}) == 0


CHILD_PRINTS_ENV = """
import json, os
names = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "SLURMTOOLS_ATTEMPT_NUMBER",
         "SLURMTOOLS_ATTEMPT_ID")
print("env " + json.dumps({name: os.environ.get(name) for name in names}), flush=True)
open(os.path.join(os.environ["SLURMTOOLS_CONTROL_DIR"], "complete"), "w").write("{}")
"""


def test_the_step_gets_its_attempt_number_and_a_flight_recorder_dir(tmp_path, capsys):
    import json
    import os
    import sys

    from slurmtools.requeue import supervisor
    control = tmp_path / "control"
    config = supervisor.SupervisorConfig(requeue=RequeueSpec(hang_timeout_s=0), control_dir=control, poll_s=0.1)
    environ = {key: value for key, value in os.environ.items() if not key.startswith(("SLURM", "TORCH_"))}
    assert supervisor.run(config, [sys.executable, "-c", CHILD_PRINTS_ENV], environ) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("env "))
    recorder = control / "flight-recorder" / "local.0"
    assert json.loads(line[4:]) == {"TORCH_FR_DUMP_TEMP_FILE": f"{recorder}/rank_",
                                    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{recorder}/rank_",
                                    "SLURMTOOLS_ATTEMPT_NUMBER": "0", "SLURMTOOLS_ATTEMPT_ID": "local.0"}
    assert recorder.is_dir()


def test_a_spare_that_took_a_lost_nodes_ranks_is_watched_from_when_it_joined():
    from slurmtools.requeue import nodecheck
    watch = nodecheck.NodeWatch(10, ["node1", "node2", "node3"], "node1", 90.0)
    watch.failed_since["node2"] = 120.0
    watch.swap(["node2"], ["node4"], 125.0)
    assert watch.step_nodes == ["node1", "node3", "node4"] and watch.candidates == ["node3", "node4"]
    assert "node2" not in watch.failed_since and watch.joined_s == {"node4": 125.0}
    beats = [beat(0, "node1", 130.0), beat(2, "node3", 131.0)]
    # silent since it joined (125.0), not since the launch (90.0)
    assert watchdog.silent_step_nodes(beats, watch.candidates, 90.0, 136.0, 10.0, watch.joined_s) == [("node4", 11.0)]
    assert watchdog.silent_step_nodes(beats, watch.candidates, 90.0, 134.0, 10.0, watch.joined_s) == []
    watch.close()
