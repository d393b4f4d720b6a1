"""Recovery without relaunch on the real mini-cluster (docs/recovery.md, "In place"; marker matrix:
lane 2's 5-node cluster). The srun launcher, 2 nodes x 1 rank and a hot spare, in-memory snapshots
every step. The second node is killed: its rank starts again on the spare (the warm standby
started there with the step, torch imported, given its go) and pulls its state from the replica
its peer keeps, while rank 0 keeps its process (the same pid trains on); the
job completes in its first step, without a relaunch or a requeue, with the uninterrupted run's
exact hash, and the ledger counts the node failure."""
from __future__ import annotations

import psutil
import pytest

from slurmtools.common import ledger
from slurmtools.common.control_dir import control_dir_for
from slurmtools.minicluster import faults
from slurmtools.slurm import commands as slurm
from tests.cluster import training
from tests.cluster.test_faults import _expand
from tests.cluster.test_recovery import _restore, workdir  # noqa: F401  (the fixture)
from tests.conftest import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.matrix]


def _rank_pid(job: int, rank: int) -> int:
    found = [p.pid for p, env in training._trainers(job, training.TRAIN) if env.get("RANK") == str(rank)]
    assert len(found) == 1, found
    return found[0]


def test_a_killed_node_is_recovered_in_place_and_the_survivor_keeps_its_process(cluster, workdir, reference_run):
    spec = training.training_spec(workdir, "inplace", launcher="srun",
                                  extra=["--step-sleep-s", "0.5", "--checkpoint-every", "100"],
                                  requeue={"spare_nodes": 1, "in_place": True},
                                  distributed=training.SNAPSHOTS_EVERY_STEP)
    job = training.submit(spec)
    training.wait_step(spec, job, 6)
    nodes = _expand(training.supervisor_events(training.events(spec, job), "start")[0]["nodes"])
    survivor = _rank_pid(job, 0)
    victim = nodes[1]
    faults.kill_node(cluster, victim)
    try:
        wait_for(lambda: training.supervisor_events(training.events(spec, job), "in_place"), 120,
                 f"job {job}'s in-place recovery", interval_s=0.2)
        assert psutil.pid_exists(survivor) and _rank_pid(job, 0) == survivor       # not relaunched
        info = training.wait_finished(job, 240)
        evts = training.events(spec, job)
        story = training.supervisor_story(evts) + "\n" + training.describe(spec, job)
        assert info.state == "COMPLETED", story
        recovered = training.supervisor_events(evts, "in_place")
        assert [(r["generation"], r["lost"], len(r["spares"])) for r in recovered] == [(1, [victim], 1)], story
        spare = recovered[0]["spares"][0]
        assert spare not in nodes
        assert recovered[0]["warm"] == [spare], story                # its warm standby took the rank
        # one step of Slurm's, never relaunched: one start, one decision (completed)
        assert [s["attempt_id"] for s in training.supervisor_events(evts, "start")] == [f"{job}.0"], story
        assert [(d["cause"], d["action"]) for d in training.supervisor_events(evts, "decision")] == [
            ("completed", "complete")], story
        resumed = training.trainer_events(evts, "resumed")
        assert resumed and "pulled from" in resumed[-1]["path"], resumed
        assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference_run["hash"]
        control = control_dir_for(spec.checkpoint_dir, spec.output_dir, str(job))
        survived = [e for e in ledger.read(control) if isinstance(e, ledger.InPlaceRecovery)]
        assert [(e.generation, e.lost, e.spares) for e in survived] == [(1, victim, spare)]
        assert [(r.cause.value, r.counted) for r in ledger.history(ledger.read(control))] == [
            ("node_failure", True), ("completed", False)]
        assert slurm.job_state(job).restarts == 0
        assert training.leftover_trainers(job) == []
    finally:
        _restore(cluster, victim)
