"""The supervisor's in-place decision (slurmtools/requeue/inplace_plan.py): survivors keep their
ranks, a spare takes a lost node's whole block, and whatever cannot be done in place says why."""
from __future__ import annotations

import pytest

from slurmtools.common.ledger import AttemptRecord, Cause
from slurmtools.requeue.inplace_plan import (InPlacePlan, Replacement, TaskFailure, crash_verdict, end_ranks_argv,
                                             hang_verdict,
                                             node_standby_argv, plan, ranks_per_node, replacement_argv, restart,
                                             restart_argv, standby_argv, surviving)
from slurmtools.requeue.policy import Diagnosis
from slurmtools.spec import RequeueSpec


def test_a_spare_takes_the_lost_nodes_block_and_every_survivor_keeps_its_ranks():
    found = plan(["n1", "n2", "n3", "n4"], {"n3"}, ["n5", "n6"], 8, 1, "n1")
    assert found == InPlacePlan(1, 32, (Replacement("n3", "n5", 16, 8),), ("n1", "n2", "n5", "n4"))
    assert found.spares_used == ["n5"]


def test_two_nodes_lost_together_take_two_spares_in_order_in_the_next_generation():
    found = plan(["n1", "n5", "n3", "n4"], {"n4", "n5"}, ["n5", "n6", "n7"], 2, 3, "n1")      # n5: lost, no spare
    assert isinstance(found, InPlacePlan)
    assert found.replacements == (Replacement("n5", "n6", 2, 2), Replacement("n4", "n7", 6, 2))
    assert (found.generation, found.world, found.placement) == (3, 8, ("n1", "n6", "n3", "n7"))


@pytest.mark.parametrize("placement, lost, spares, ranks, why", [
    (["n1", "n2"], {"n1"}, ["n3"], 1, "the batch host n1 is lost (the generation's store and the supervisor were on it)"),
    (["n1", "n2", "n3"], {"n2", "n3"}, ["n4"], 1, "2 node(s) lost, 1 spare(s) left"),
    (["n1", "n2"], {"n2"}, [], 4, "1 node(s) lost, 0 spare(s) left"),
    (["n1", "n2"], {"n9"}, ["n3"], 1, "n9 held no ranks of this step"),
    (["n1", "n2"], set(), ["n3"], 1, "no node of this step is lost"),
    (["n1", "n2"], {"n2"}, ["n3"], 0, "0 ranks per node: the launcher places no ranks of ours"),
])
def test_what_cannot_be_done_in_place_says_why_in_one_line(placement, lost, spares, ranks, why):
    assert plan(placement, lost, spares, ranks, 1, "n1") == why


SRUN = ["srun", "--kill-on-bad-exit=1", "--nodes=2", "--cpus-per-task=1", "--cpu-bind=cores", "--ntasks-per-node=2",
        "bash", "-c", 'exec "$@"', "slurmtools-task", "python3", "train.py", "--nodes=9"]


def test_the_steps_srun_survives_a_lost_node_and_a_replacement_runs_on_the_spare_alone():
    assert ranks_per_node(SRUN) == 2
    assert surviving(SRUN) == ["srun", "--no-kill", "--kill-on-bad-exit=0", "--nodes=2", "--cpus-per-task=1",
                               "--cpu-bind=cores", "--ntasks-per-node=2", *SRUN[6:]]
    assert replacement_argv(SRUN, "node4") == [
        "srun", "--no-kill", "--kill-on-bad-exit=0", "--nodelist=node4", "--nodes=1", "--cpus-per-task=1",
        "--cpu-bind=cores", "--ntasks-per-node=2", *SRUN[6:]]       # the program's own --nodes untouched


def test_a_warm_standby_runs_the_replacements_command_through_the_standby_module():
    assert standby_argv(SRUN, "node4") == [
        "srun", "--no-kill", "--kill-on-bad-exit=0", "--nodelist=node4", "--nodes=1", "--cpus-per-task=1",
        "--cpu-bind=cores", "--ntasks-per-node=2", "bash", "-c", 'exec "$@"', "slurmtools-task", "python3",
        "-m", "slurmtools.train.standby", "train.py", "--nodes=9"]
    program = ["srun", "--ntasks-per-node=1", "bash", "-c", "x", "slurmtools-task", "./run.sh", "train.py"]
    assert standby_argv(program, "node4") is None            # not a Python script: nothing to warm
    assert standby_argv(["srun", "--ntasks-per-node=1", "python3", "train.py"], "node4") is None


def test_ranks_not_placed_by_srun_are_not_ours_to_replace():
    torchrun = ["srun", "--ntasks-per-node=1", "bash", "-c", "x", "slurmtools-agent", "python3", "-m",
                "torch.distributed.run", "--nnodes=2", "train.py"]
    assert ranks_per_node(torchrun) == 0
    assert ranks_per_node(["python3", "train.py"]) == 0 and surviving(["python3", "train.py"]) == ["python3", "train.py"]
    assert ranks_per_node(["srun", "--nodes=2", "train.py"]) == 0


def test_ranks_that_crashed_on_a_live_node_start_again_there_with_their_numbers():
    """A node's run of adjacent local ranks is one step; every rank keeps its number and its
    local rank (its GPU); the placement does not change."""
    found = restart(["n1", "n2", "n3"], [TaskFailure("n2", (1,), "Exited with exit code 9")], 4, 2)
    assert found == InPlacePlan(2, 12, (Replacement("n2", "n2", 5, 1, 1),), ("n1", "n2", "n3"))
    found = restart(["n1", "n2", "n3"], [TaskFailure("n3", (0, 1, 3), "Killed"), TaskFailure("n1", (2,), "Killed"),
                                         TaskFailure("n3", (1,), "Killed")], 4, 1)
    assert isinstance(found, InPlacePlan)
    assert found.replacements == (Replacement("n1", "n1", 2, 1, 2), Replacement("n3", "n3", 8, 2, 0),
                                  Replacement("n3", "n3", 11, 1, 3))


@pytest.mark.parametrize("failures, ranks, why", [
    ([TaskFailure("n9", (0,), "Killed")], 2, "n9 holds no ranks of this step"),
    ([TaskFailure("n2", (2,), "Killed")], 2, "task 2 on n2 is no local rank of 2 per node"),
    ([], 2, "no rank of this step failed"),
    ([TaskFailure("n2", (0,), "Killed")], 0, "0 ranks per node: the launcher places no ranks of ours"),
])
def test_a_restart_that_cannot_be_done_says_why(failures, ranks, why):
    assert restart(["n1", "n2"], failures, ranks, 1) == why


def test_a_restarted_rank_runs_beside_the_step_on_its_own_node():
    assert restart_argv(SRUN, "node2", 1) == [
        "srun", "--no-kill", "--kill-on-bad-exit=0", "--nodelist=node2", "--overlap", "--nodes=1",
        "--cpus-per-task=1", "--cpu-bind=cores", "--ntasks-per-node=1", *SRUN[6:]]


def test_each_training_node_has_one_warm_standby_beside_the_step():
    assert node_standby_argv(SRUN, ["node1", "node2"]) == [
        "srun", "--no-kill", "--kill-on-bad-exit=0", "--nodelist=node1,node2", "--overlap", "--nodes=2",
        "--cpus-per-task=1", "--cpu-bind=cores", "--ntasks-per-node=1", "bash", "-c", 'exec "$@"', "slurmtools-task",
        "python3", "-m", "slurmtools.train.standby", "train.py", "--nodes=9"]
    assert node_standby_argv(["srun", "--ntasks-per-node=1", "python3", "train.py"], ["node1"]) is None


CRASH = [TaskFailure("n2", (1,), "Exited with exit code 9")]


def _verdict(tail: str = "", faulty=(), history=(), limits: RequeueSpec = RequeueSpec(), step=None):
    return crash_verdict(CRASH, tail, faulty, list(history), limits, step, 1000.0)


def test_a_crash_is_restarted_in_place_within_the_budget_and_otherwise_said_why():
    assert _verdict() == Diagnosis(Cause.CRASH, detail="local rank 1 on n2: Exited with exit code 9")
    assert _verdict(faulty=["n2"]) == "a GPU of n2 reported a fatal fault: the node failed, not the rank"
    assert _verdict("Traceback\nNameError: name 'x' is not defined\n") == "user error (NameError)"
    assert _verdict("torch.OutOfMemoryError: CUDA out of memory\n") == "out of memory"
    spent = [AttemptRecord(Cause.CRASH, True, 10 * n, None, 900.0 + n) for n in range(3)]
    assert _verdict(history=spent, limits=RequeueSpec(max_restarts=3), step=40) == (
        "restart budget spent (3 failures within 6 h): last crash (local rank 1 on n2: Exited with exit code 9)")
    assert _verdict(limits=RequeueSpec(in_allocation=False)) == (
        "crash (local rank 1 on n2: Exited with exit code 9)")        # the policy would requeue: the relaunch's


def test_a_hung_nodes_ranks_are_ended_by_one_task_beside_the_step_on_that_node():
    assert end_ranks_argv(SRUN, "node2") == [
        "srun", "--no-kill", "--kill-on-bad-exit=0", "--nodelist=node2", "--overlap", "--nodes=1",
        "--cpus-per-task=1", "--cpu-bind=cores", "--ntasks-per-node=1", "bash", "-c", 'exec "$@"', "slurmtools-task",
        "python3", "-m", "slurmtools.train.end_ranks"]
    assert end_ranks_argv(["srun", "--ntasks-per-node=1", "python3", "train.py"], "node2") is None


def _hang(rank=3, host="n2", cut_off=(), history=(), limits: RequeueSpec = RequeueSpec(), step=None):
    return hang_verdict(rank, host, cut_off, "rank 3 on n2: no step for 12 s", list(history), limits, step, 1000.0)


def test_a_hang_behind_one_rank_replaces_its_node_in_place_within_the_budget_and_otherwise_says_why():
    assert _hang() == Diagnosis(Cause.HANG, node="n2", detail="rank 3 on n2: no step for 12 s", fatal_for_node=True)
    assert _hang(rank=None, host=None) == "no single rank is behind: no node to replace"
    assert _hang(cut_off=("n3",)) == "n3 does not answer: lost to the job, not hung"
    hung_twice = [AttemptRecord(Cause.HANG, True, 40, "n2", 900.0 + n) for n in range(2)]
    assert _hang(history=hung_twice, limits=RequeueSpec(max_consecutive_failures=2), step=40) == (
        "hang 3 times in a row (rank 3 on n2: no step for 12 s)")
    assert _hang(limits=RequeueSpec(in_allocation=False)) == "hang (rank 3 on n2: no step for 12 s)"
