"""A rank crash recovered without relaunch on the real mini-cluster (docs/recovery.md, "In place"):
the srun launcher, 2 nodes x 2 ranks, no spare, in-memory snapshots every step. Rank 3 (local rank
1 of the second node) ends at once before step 6, as a process the kernel killed; srun says so, its
node's slurmd answers: a crash, within the restart budget, so rank 3 starts again on its own node
(from the node's warm standby, started with the step beside it, given its go: its rank and its
local rank, hence its GPU) and restores its state from its node's memory, while ranks 0-2 keep
their processes. One step of Slurm's, no
relaunch, the uninterrupted 2 x 2 run's exact hash, and the ledger counts one crash. (A second
failure during such a recovery, and a fully loaded machine: tests/cluster/test_inplace_recovery.py,
lane 2.)"""
from __future__ import annotations

import psutil
import pytest

from slurmtools.common import ledger
from slurmtools.common.control_dir import control_dir_for
from slurmtools.slurm import commands as slurm
from tests.cluster import training
from tests.cluster.test_faults import _expand
from tests.cluster.test_recovery import workdir  # noqa: F401  (the fixture)
from tests.conftest import wait_for

pytestmark = [pytest.mark.cluster]


def test_a_crashed_rank_restarts_on_its_node_while_every_other_rank_keeps_its_process(cluster, workdir,
                                                                                       reference_run_4):
    spec = training.training_spec(workdir, "crashinplace", launcher="srun", processes_per_node=2,
                                  extra=["--step-sleep-s", "0.5", "--checkpoint-every", "100",
                                         "--kill-rank-at", "3:6"],
                                  requeue={"in_place": True}, distributed=training.SNAPSHOTS_EVERY_STEP)
    job = training.submit(spec)
    training.wait_step(spec, job, 2)
    before = training.rank_pids(job)
    assert sorted(before) == ["0", "1", "2", "3"] and all(len(pids) == 1 for pids in before.values()), before
    wait_for(lambda: training.trainer_events(training.events(spec, job), "resumed"), 120,
             f"job {job}'s ranks resumed in place", interval_s=0.2)
    after = training.rank_pids(job)
    info = training.wait_finished(job, 240)
    evts = training.events(spec, job)
    story = training.supervisor_story(evts) + "\n" + training.describe(spec, job)
    assert info.state == "COMPLETED", story
    for rank in ("0", "1", "2"):                             # not relaunched: the same processes
        assert after.get(rank) == before[rank], (rank, before, after, story)
    assert "3" not in after, after                 # its process is gone; the standby that took it says no RANK
    second = _expand(training.supervisor_events(evts, "start")[0]["nodes"])[1]
    recovered = training.supervisor_events(evts, "in_place")
    assert [(r["generation"], r["cause"], r["lost"], r["spares"], r["ranks"], r["warm"]) for r in recovered] == [
        (1, "crash", [second], [second], [[3, 1]], [second])], story
    assert [s["attempt_id"] for s in training.supervisor_events(evts, "start")] == [f"{job}.0"], story
    assert [(d["cause"], d["action"]) for d in training.supervisor_events(evts, "decision")] == [
        ("completed", "complete")], story
    resumed = training.trainer_events(evts, "resumed")
    assert resumed and resumed[-1]["path"].startswith("in-memory"), resumed
    assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference_run_4["hash"]
    control = control_dir_for(spec.checkpoint_dir, spec.output_dir, str(job))
    assert [(r.cause.value, r.counted, r.node) for r in ledger.history(ledger.read(control))] == [
        ("crash", True, None), ("completed", False, None)]
    assert slurm.job_state(job).restarts == 0
    assert not psutil.pid_exists(before["3"][0]) and training.leftover_trainers(job) == []
