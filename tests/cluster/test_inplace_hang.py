"""A hang recovered without relaunch on the real mini-cluster (docs/recovery.md, "In place"; part a
of the suite, lane 3: a 3-node cluster, 2 nodes x 1 rank and a hot spare, the srun launcher,
in-memory snapshots every step). The hung rank's node is blamed as a relaunch would blame it,
its ranks are ended there by a step beside the training step, and its rank starts again on the
spare while rank 0 keeps its process."""
from __future__ import annotations

import pytest

from slurmtools.common import ledger
from slurmtools.common.control_dir import control_dir_for
from slurmtools.slurm import commands as slurm
from tests.cluster import training
from tests.cluster.test_faults import _expand
from tests.cluster.test_inplace_recovery import _survived_in_place
from tests.cluster.test_recovery import workdir  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.cluster]


def test_a_hung_ranks_node_is_replaced_in_place_and_the_survivor_keeps_its_process(cluster, workdir, reference_run):
    """Rank 1 (2 nodes x 1 rank, a spare) hangs before step 6, its peer waiting for it in a
    collective: after the hang timeout its node is blamed (as a relaunch would blame it), the
    ranks there are ended by a step beside the training step, the node drained, and its rank
    starts again on the spare's warm standby, pulling its state from its peer's replica, while
    rank 0 keeps its process. One step of Slurm's, the uninterrupted run's exact hash, a hang
    counted in the ledger."""
    spec = training.training_spec(workdir, "hanginplace", launcher="srun",
                                  extra=["--step-sleep-s", "0.2", "--checkpoint-every", "100", "--hang-at-step", "1:6"],
                                  requeue={"spare_nodes": 1, "in_place": True, "hang_timeout_s": 10},
                                  distributed=training.SNAPSHOTS_EVERY_STEP)
    job = training.submit(spec)
    training.wait_step(spec, job, 3)
    nodes = _expand(training.supervisor_events(training.events(spec, job), "start")[0]["nodes"])
    survivor = training.rank_pid(job, 0)
    evts, story = _survived_in_place(spec, job, survivor)
    assert [(h["rank"], h["host"], h["in_place"]) for h in training.supervisor_events(evts, "hang")] == [
        (1, nodes[1], True)], story
    recovered = training.supervisor_events(evts, "in_place")
    assert [(r["generation"], r["lost"], r["cause"], r["ranks"]) for r in recovered] == [
        (1, [nodes[1]], "hang", [[1, 1]])], story
    spare = recovered[0]["spares"][0]
    assert spare not in nodes and recovered[0]["warm"] == [spare], story
    assert [s["attempt_id"] for s in training.supervisor_events(evts, "start")] == [f"{job}.0"], story
    assert [(d["cause"], d["action"]) for d in training.supervisor_events(evts, "decision")] == [
        ("completed", "complete")], story
    assert "pulled from" in training.trainer_events(evts, "resumed")[-1]["path"], story
    assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference_run["hash"]
    reason = training.blamed_reason(nodes[1], job)
    assert reason.startswith(f"slurmtools: CRITICAL job.hang rank 1 on {nodes[1]}: no step for "), reason
    control = control_dir_for(spec.checkpoint_dir, spec.output_dir, str(job))
    assert [(r.cause.value, r.counted, r.node) for r in ledger.history(ledger.read(control))] == [
        ("hang", True, nodes[1]), ("completed", False, None)]
    assert slurm.job_state(job).restarts == 0
    assert training.leftover_trainers(job) == []          # the hung rank too: ended on its node
