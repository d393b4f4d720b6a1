"""Recovery without relaunch on the real mini-cluster (docs/recovery.md, "In place"; marker matrix:
lane 2's 5-node cluster). The srun launcher, 2 nodes x 1 rank and a hot spare, in-memory snapshots
every step. The second node is killed: its rank starts again on the spare (the warm standby
started there with the step, torch imported, given its go) and pulls its state from the replica
its peer keeps, while rank 0 keeps its process (the same pid trains on); the
job completes in its first step, without a relaunch or a requeue, with the uninterrupted run's
exact hash, and the ledger counts the node failure. A second failure during a recovery in place (a
crashed rank's restarted process lost before it joins) falls back to the relaunch; and a machine
whose cores are all busy makes no loss of what is only slow. (A rank crash recovered in place:
tests/cluster/test_inplace_crash.py; a hang: tests/cluster/test_inplace_hang.py; a Lightning
trainer's lost node: tests/cluster/test_inplace_lightning.py.)"""
from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from slurmtools.minicluster import faults
from slurmtools.slurm import commands as slurm
from tests.cluster import training
from tests.cluster.test_faults import _expand
from tests.cluster.test_recovery import _restore, workdir  # noqa: F401  (the fixture)
from tests.conftest import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.matrix]


def _survived_in_place(spec, job: int, survivor: int):
    """The job's recovery in place, rank 0's process the same before and after it, and the job
    COMPLETED: its events, and its story for the assertions that follow."""
    wait_for(lambda: training.supervisor_events(training.events(spec, job), "in_place"), 120,
             f"job {job}'s in-place recovery", interval_s=0.2)
    assert psutil.pid_exists(survivor) and training.rank_pid(job, 0) == survivor       # not relaunched
    info = training.wait_finished(job, 240)
    evts = training.events(spec, job)
    story = training.supervisor_story(evts) + "\n" + training.describe(spec, job)
    assert info.state == "COMPLETED", story
    return evts, story


def test_a_killed_node_is_recovered_in_place_and_the_survivor_keeps_its_process(cluster, workdir, reference_run):
    spec = training.training_spec(workdir, "inplace", launcher="srun",
                                  extra=["--step-sleep-s", "0.5", "--checkpoint-every", "100"],
                                  requeue={"spare_nodes": 1, "in_place": True},
                                  distributed=training.SNAPSHOTS_EVERY_STEP)
    job = training.submit(spec)
    training.wait_step(spec, job, 6)
    nodes = _expand(training.supervisor_events(training.events(spec, job), "start")[0]["nodes"])
    survivor = training.rank_pid(job, 0)
    victim = nodes[1]
    faults.kill_node(cluster, victim)
    try:
        evts, story = _survived_in_place(spec, job, survivor)
        recovered = training.supervisor_events(evts, "in_place")
        assert [(r["generation"], r["lost"], len(r["spares"])) for r in recovered] == [(1, [victim], 1)], story
        spare = recovered[0]["spares"][0]
        assert spare not in nodes
        assert recovered[0]["warm"] == [spare], story                # its warm standby took the rank
        training.assert_one_node_recovered_in_place(spec, job, evts, story, victim, spare)
        resumed = training.trainer_events(evts, "resumed")
        assert resumed and "pulled from" in resumed[-1]["path"], resumed
        assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference_run["hash"]
    finally:
        _restore(cluster, victim)


def test_a_second_failure_during_a_recovery_in_place_falls_back_to_the_relaunch(cluster, workdir, reference_run):
    """Rank 1 (2 nodes x 1 rank) crashes before step 6 and is restarted in place; its restarted
    process is lost too, before it joins (--kill-replacement): a second failure while generation 1
    forms is not recovered in place (the survivors are joining a group it will never join). The
    relaunch takes over at once and the run still ends with the uninterrupted run's exact hash."""
    spec = training.training_spec(workdir, "secondfailure", launcher="srun",
                                  extra=["--step-sleep-s", "0.2", "--checkpoint-every", "100",
                                         "--kill-rank-at", "1:6", "--kill-replacement"],
                                  requeue={"in_place": True}, distributed=training.SNAPSHOTS_EVERY_STEP)
    job = training.submit(spec)
    info = training.wait_finished(job, 300)
    evts = training.events(spec, job)
    story = training.supervisor_story(evts) + "\n" + training.describe(spec, job)
    assert info.state == "COMPLETED", story
    assert [(r["generation"], r["cause"], r["ranks"]) for r in training.supervisor_events(evts, "in_place")] == [
        (1, "crash", [[1, 1]])], story
    assert [r["reason"] for r in training.supervisor_events(evts, "in_place_refused")] == [
        "a second failure while generation 1 forms"], story
    assert len(training.supervisor_events(evts, "rank_lost")) == 1, story
    assert [s["attempt_id"] for s in training.supervisor_events(evts, "start")] == [f"{job}.0", f"{job}.0.1"], story
    assert [(d["cause"], d["action"]) for d in training.supervisor_events(evts, "decision")] == [
        ("crash", "restart"), ("completed", "complete")], story
    # R135: once the job completed with no final line in its output: the output's last lines say why
    finals = training.trainer_events(evts, "final")
    assert finals, story + "\n== the job's output, last lines:\n" + "\n".join(
        training.output(spec, job).splitlines()[-40:]) + "\n== its stderr:\n" + "\n".join(
        training.stderr(spec, job).splitlines()[-40:])
    assert finals[-1]["state_sha256"] == reference_run["hash"]
    assert slurm.job_state(job).restarts == 0
    assert training.leftover_trainers(job) == []


LOSS_EVENTS = ("node_dead", "in_place", "in_place_refused", "in_place_failed", "rank_lost", "hang")


def test_a_fully_loaded_machine_makes_no_loss_of_what_is_only_slow(cluster, workdir, reference_run):
    """A busy loop per core beside everything else the machine runs, a node timeout of 3 s: a
    rank's beat may come late, but no node is declared dead (its slurmd answers), no rank lost, no
    recovery started; the run completes in its one step with the uninterrupted run's hash."""
    spec = training.training_spec(workdir, "loaded", launcher="srun",
                                  extra=["--step-sleep-s", "0.1", "--checkpoint-every", "100"],
                                  requeue={"in_place": True, "spare_nodes": 1, "node_timeout_s": 3},
                                  distributed=training.SNAPSHOTS_EVERY_STEP)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        job = training.submit(spec)
        info = training.wait_finished(job, 400)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    evts = training.events(spec, job)
    story = training.supervisor_story(evts) + "\n" + training.describe(spec, job)
    assert info.state == "COMPLETED", story
    assert [e for e in evts if e.get("slurmtools") in LOSS_EVENTS] == [], story
    assert [(d["cause"], d["action"]) for d in training.supervisor_events(evts, "decision")] == [
        ("completed", "complete")], story
    assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference_run["hash"]
