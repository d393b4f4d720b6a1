"""What a loss heard of while the step runs becomes (slurmtools/requeue/inplace_loss.py), with real
processes and sockets and no Slurm: a node whose slurmd does not answer is dead; tasks srun says
failed on a live node are a crash, restarted where they ran (their numbers, their local ranks, the
next generation) within the restart budget and recorded; what cannot be is said for the relaunch.
The srun side is tested on the mini-cluster (tests/cluster/test_inplace_recovery.py)."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from slurmtools.common import generation, ledger
from slurmtools.requeue import actions, inplace_loss, inplace_step, nodecheck, topology, watchdog
from slurmtools.requeue.inplace_plan import TaskFailure
from slurmtools.spec import RequeueSpec


@pytest.fixture
def slurmds():
    """n2's slurmd does not answer, n3's does (real sockets stand for them)."""
    alive = socket.socket()
    alive.bind(("127.0.0.1", 0))
    alive.listen()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead_port = closed.getsockname()[1]
    closed.close()
    watch = nodecheck.NodeWatch(10, ["n1", "n2", "n3"], "n1", 0.0)
    watch.endpoints = {"n2": ("127.0.0.1", dead_port), "n3": alive.getsockname()}
    watch.reprobe_after_s = 0.1
    yield watch
    alive.close()
    watch.close()


def _in_place(tmp_path, program=("true",), env=None) -> inplace_step.InPlace:
    in_place = inplace_step.InPlace(tmp_path, list(program), env or {"PATH": "/usr/bin:/bin"}, ["n1", "n2", "n3"],
                                    "n1", "n1", attempt_id="7.0")
    in_place.ranks_per_node = 2
    # a stand-in for the store host (the generation only names its port): ends when stdin closes
    in_place.store = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    in_place.store_port = 1
    return in_place


def test_a_loss_is_heard_of_at_once_and_told_apart_a_dead_node_from_a_crashed_rank(tmp_path, slurmds):
    """A node's word that its group broke has every slurmd of the step asked at once (no node
    timeout); srun's line for a failed task has its node's asked: dead, or a crash for on_crashed."""
    in_place = _in_place(tmp_path)
    crashed: list = []
    try:
        assert inplace_loss.task_failed(in_place, slurmds, crashed.append) is None
        generation.report_broken(tmp_path, 0, "n3", "Connection closed by peer")
        death = inplace_loss.task_failed(in_place, slurmds, crashed.append)
        assert isinstance(death, nodecheck.Death) and death.nodes == ("n2",)
        assert inplace_loss.task_failed(in_place, slurmds, crashed.append) is None          # that report was heard
        in_place.feed(None)("srun: error: n3: tasks 4-5: Exited with exit code 1\n")
        assert inplace_loss.task_failed(in_place, slurmds, lambda found: crashed.append(found) or None) is None
        assert crashed == [[TaskFailure("n3", (0, 1), "Exited with exit code 1")]]
        in_place.feed(None)("srun: error: n3: task 5: Killed\n")
        assert inplace_loss.task_failed(in_place, slurmds, lambda found: "restart budget spent") == (
            "a rank was lost on a live node (every slurmd of n3 answers): restart budget spent")
        # a crash on a node found dead with another: heard next time, after the dead node's recovery
        in_place.feed(None)("srun: error: n2: task 2: Killed\n")
        in_place.feed(None)("srun: error: n3: task 4: Exited with exit code 9\n")
        death = inplace_loss.task_failed(in_place, slurmds, crashed.append)
        assert isinstance(death, nodecheck.Death) and death.nodes == ("n2",)
        assert in_place.failures() == [TaskFailure("n3", (0,), "Exited with exit code 9")]
    finally:
        in_place.finish(1)


def test_a_broken_group_without_a_failed_task_waits_for_srun_then_is_the_relaunch(tmp_path, slurmds, monkeypatch):
    """Every slurmd answers: srun's line for the crashed rank is awaited (it comes within a poll);
    none within FAILED_TASK_WAIT_S is a rank lost that cannot be restarted in place."""
    monkeypatch.setattr(inplace_loss, "FAILED_TASK_WAIT_S", 0.3)
    slurmds.endpoints["n2"] = slurmds.endpoints["n3"]
    in_place = _in_place(tmp_path)
    try:
        generation.report_broken(tmp_path, 0, "n3", "Connection closed by peer")
        assert inplace_loss.task_failed(in_place, slurmds, lambda found: None) is None
        time.sleep(0.4)
        assert inplace_loss.task_failed(in_place, slurmds, lambda found: None) == (
            "a rank's group broke, every slurmd answers and srun named no failed task within 0.3 s")
    finally:
        in_place.finish(1)


PRINT_ENV = [sys.executable, "-c", "import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
             "if k.startswith(('SLURMTOOLS_', 'SLURM_MEM'))}))"]


def test_a_crash_within_the_budget_restarts_its_ranks_where_they_ran_and_is_recorded(tmp_path, capsys):
    """The restart step gets the ranks' numbers, their local ranks and the next generation, and
    none of the job's memory request (it runs beside the step that holds it); the ledger counts a
    crash (no node blamed); a second crash while its generation forms, or past the budget, is
    refused, said for the relaunch."""
    lines: list = []
    in_place = _in_place(tmp_path, PRINT_ENV, {"PATH": "/usr/bin:/bin", "SLURM_MEM_PER_CPU": "500"})
    in_place.feed(lines.append)
    crash = [TaskFailure("n2", (1,), "Exited with exit code 9")]
    try:
        assert inplace_loss.on_crash(in_place, crash, RequeueSpec(max_restarts=1), None, "") is None
        assert generation.read(tmp_path) == generation.Generation(1, 6, "n1", 1)
        deadline = time.monotonic() + 30
        while in_place.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert in_place.failed_replacement() is None
        in_place.replacements[0].finish(5)
        assert [json.loads(line) for line in lines] == [{
            "SLURMTOOLS_GENERATION": "1", "SLURMTOOLS_INPLACE": "1", "SLURMTOOLS_LOCAL_RANK_BASE": "1",
            "SLURMTOOLS_RANK_BASE": "3", "SLURMTOOLS_WORLD_SIZE": "6"}]
        recorded = [e for e in ledger.read(tmp_path) if isinstance(e, ledger.InPlaceRecovery)]
        assert [(e.generation, e.lost, e.spares, e.cause, e.detail) for e in recorded] == [
            (1, "n2", "n2", "crash", "local rank 1 on n2: Exited with exit code 9")]
        assert [(r.cause.value, r.counted, r.node) for r in ledger.history(ledger.read(tmp_path))] == [
            ("crash", True, None)]
        assert inplace_loss.on_crash(in_place, crash, RequeueSpec(max_restarts=1), None, "") == (
            "a second failure while generation 1 forms")        # its ranks are joining: one lost never would
        generation.report_formed(tmp_path, 1)
        assert inplace_loss.on_crash(in_place, crash, RequeueSpec(max_restarts=1), None, "") == (
            "restart budget spent (1 failures within 6 h): last crash (local rank 1 on n2: Exited with exit code 9)")
    finally:
        in_place.finish(1)
    said = [e for e in map(json.loads, capsys.readouterr().out.splitlines()) if "slurmtools" in e]
    assert [(e["slurmtools"], e.get("cause"), e.get("ranks"), e.get("reason", "")[:21]) for e in said] == [
        ("in_place", "crash", [[3, 1]], ""), ("in_place_refused", None, None, "a second failure whil"),
        ("in_place_refused", None, None, "restart budget spent ")]


def test_a_replacement_whose_rank_crashed_is_left_to_the_crash_path(tmp_path):
    """A restarted or replacement step that ends badly because its rank failed (srun said so) is
    heard as a crash, not as a failed replacement (which would end the step for the relaunch)."""
    program = [sys.executable, "-c", "import sys; print('srun: error: n2: task 0: Exited with exit code 9', "
               "file=sys.stderr); sys.exit(9)"]
    in_place = _in_place(tmp_path, program)
    in_place.feed(None)
    try:
        assert not isinstance(in_place.restart([TaskFailure("n2", (1,), "Killed")]), str)
        in_place.replacements[0].child.wait(30)
        assert in_place.failed_replacement() is None and in_place.retired == {0}
        assert in_place.failures() == [TaskFailure("n2", (1,), "Exited with exit code 9")]     # its local rank
    finally:
        in_place.finish(1)


def test_a_crashed_rank_is_restarted_from_its_nodes_warm_standby(tmp_path):
    """The node's standby (started with the step) is given its go: the rank, the world, its local
    rank; no step is launched. Its own failure later is heard with that local rank; a standby that
    ended before any go leaves its node without one (the next crash there gets a step)."""
    in_place = _in_place(tmp_path)
    in_place.feed(None)
    in_place.node_standby = inplace_step.step.launch(["sleep", "60"], {"PATH": "/usr/bin:/bin"})
    in_place.node_standby_waiting = {"n1", "n2", "n3"}
    hook = in_place.feed(None, in_place._standby_local)
    try:
        found = in_place.restart([TaskFailure("n2", (1,), "Killed")])
        assert not isinstance(found, str) and in_place.warm == ["n2"]
        assert generation.parse_go((tmp_path / "standby-n2.json").read_text()) == (1, 3, 6, 1)
        assert in_place.replacements == [in_place.node_standby] and in_place.launches == {}
        hook("srun: error: n2: task 1: Exited with exit code 9\n")     # the standby step's task on n2
        hook("srun: error: n3: task 2: Exited with exit code 1\n")     # n3's standby, never given a go
        assert in_place.failures() == [TaskFailure("n2", (1,), "Exited with exit code 9")]
        assert in_place.node_standby_waiting == {"n1"}
    finally:
        in_place.finish(1)
    assert in_place.node_standby is None


def test_a_hung_nodes_ranks_are_ended_and_started_on_a_spare_and_the_hang_is_recorded(tmp_path, slurmds, monkeypatch,
                                                                                       capsys):
    """A stall behind rank 3 (on n2, 2 ranks a node): n2's ranks go to the spare n4 in the next
    generation, a step on n2 ends the attempt's processes there, and the ledger counts a hang on
    n2. A stall while that generation forms, or within a hang timeout of the recovery, is the
    recovery's own (waited out: no second one); a stall behind no single rank is the relaunch's."""
    ended: list = []
    monkeypatch.setattr(inplace_loss.inplace_plan, "end_ranks_argv",
                        lambda argv, node: ended.append(node) or [sys.executable, "-c", "pass"])
    in_place = _in_place(tmp_path)
    run = actions.Run(topology.topology_of(["n1", "n2", "n3", "n4"], RequeueSpec(spare_nodes=1)))
    limits = RequeueSpec(spare_nodes=1, hang_timeout_s=10)
    stall = watchdog.Stall(12.0, 3, "n2", 6)
    try:
        assert inplace_loss.on_hang(in_place, watchdog.Stall(12.0, None, None, 6), limits, 7, run, slurmds, None,
                                    None) is False
        assert inplace_loss.on_hang(in_place, stall, limits, 7, run, slurmds, None, None) is True
        assert generation.read(tmp_path) == generation.Generation(1, 6, "n1", 1)
        assert in_place.placement == ["n1", "n4", "n3"] and run.lost == ["n2"] and ended == ["n2"]
        assert inplace_loss.on_hang(in_place, stall, limits, 7, run, slurmds, None, None) is True   # forming
        generation.report_formed(tmp_path, 1)
        assert inplace_loss.on_hang(in_place, stall, limits, 7, run, slurmds, None, None) is True   # quiet
        assert in_place.generation == 1 and len(in_place.enders) == 1
        recorded = [e for e in ledger.read(tmp_path) if isinstance(e, ledger.InPlaceRecovery)]
        assert [(e.generation, e.lost, e.spares, e.cause) for e in recorded] == [(1, "n2", "n4", "hang")]
        assert recorded[0].detail == "rank 3 on n2: no step for 12 s (hang timeout 10 s)"
        assert [(r.cause.value, r.counted, r.node) for r in ledger.history(ledger.read(tmp_path))] == [
            ("hang", True, "n2")]
    finally:
        in_place.finish(1)
    said = [e for e in map(json.loads, capsys.readouterr().out.splitlines()) if "slurmtools" in e]
    assert [(e["slurmtools"], e.get("cause"), e.get("lost"), e.get("reason")) for e in said
            if e["slurmtools"] in ("in_place", "in_place_refused", "hang")] == [
        ("in_place_refused", None, None, "no single rank is behind: no node to replace"),
        ("hang", None, None, None), ("in_place", "hang", ["n2"], None)]


def test_a_hang_whose_ranks_nothing_can_end_is_the_relaunchs(tmp_path, slurmds, capsys):
    """The ranks' program is no Python script of the srun launcher's: no step can end them on
    their node, no generation is named, and the relaunch stops the whole step."""
    in_place = _in_place(tmp_path)
    run = actions.Run(topology.topology_of(["n1", "n2", "n3", "n4"], RequeueSpec(spare_nodes=1)))
    try:
        assert inplace_loss.on_hang(in_place, watchdog.Stall(12.0, 3, "n2", 6), RequeueSpec(spare_nodes=1), 7, run,
                                    slurmds, None, None) is False
        assert in_place.generation == 0 and in_place.enders == [] and run.lost == []
    finally:
        in_place.finish(1)
    said = [e for e in map(json.loads, capsys.readouterr().out.splitlines()) if e.get("slurmtools") == "in_place_refused"]
    assert [e["reason"] for e in said] == [
        "the ranks' program is no Python script of the srun launcher's: nothing ends them on their node"]
