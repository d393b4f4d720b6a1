"""A PyTorch Lightning trainer recovered without relaunch on the real mini-cluster (docs/recovery.md,
"In place"; slurmtools/integrations/lightning_inplace.py): examples/lightning/train.py as it is,
the srun launcher, 2 nodes x 1 rank and a hot spare. The second node is killed: rank 0's process
does not exit (Lightning's fit raises the broken group's error; `fit` leaves it, joins the next
generation and fits again with a new Trainer), rank 1 starts on the spare from the warm standby
started there with the step (torch and Lightning imported), and both resume from the last step rank
0 finished, the copy of Lightning's state it keeps in its memory (the job's snapshots every step;
lightning_memory), not from the older sealed checkpoint: no step trained twice. One step of Slurm's,
no relaunch, no requeue, the node failure counted. (The relaunch path of the same trainer:
tests/cluster/test_frameworks.py; two real DDP ranks recovered in place from the checkpoint and
from memory, without Slurm: tests/unit/test_lightning_inplace.py.)"""
from __future__ import annotations


import psutil
import pytest

from slurmtools.minicluster import faults
from tests.cluster import training
from tests.cluster.test_faults import _expand
from tests.cluster.test_recovery import _restore, workdir  # noqa: F401  (the fixture)
from tests.conftest import wait_for
from tests.example_output import resumed_at, steps_said

pytestmark = [pytest.mark.cluster]

LIGHTNING = training.REPO / "examples" / "lightning" / "train.py"
STEPS = 16
CHECKPOINT_EVERY = 8       # sealed at 8 and 16: the loss after step 9 is newer in memory


def test_a_lightning_trainers_lost_node_is_recovered_in_place_and_rank_0_keeps_its_process(cluster, workdir):
    spec = training.fault_spec(workdir, "lightning-inplace",
                               command=[str(LIGHTNING), "--steps", str(STEPS), "--checkpoint-every",
                                        str(CHECKPOINT_EVERY), "--step-sleep-s", "0.3"],
                               requeue={"spare_nodes": 1, "in_place": True},
                               distributed=training.SNAPSHOTS_EVERY_STEP)
    job = training.submit(spec)
    wait_for(lambda: max(steps_said(training.output(spec, job)), default=0) >= CHECKPOINT_EVERY + 1,
             180, f"job {job} to train past step {CHECKPOINT_EVERY}", interval_s=0.2)
    nodes = _expand(training.supervisor_events(training.events(spec, job), "start")[0]["nodes"])
    survivor = training.rank_pid(job, 0, LIGHTNING)
    victim = nodes[1]
    faults.kill_node(cluster, victim)
    try:
        wait_for(lambda: training.supervisor_events(training.events(spec, job), "in_place"), 120,
                 f"job {job}'s in-place recovery", interval_s=0.2)
        assert psutil.pid_exists(survivor) and training.rank_pid(job, 0, LIGHTNING) == survivor   # not relaunched
        info = training.wait_finished(job, 240)
        evts = training.events(spec, job)
        out = training.output(spec, job)
        story = training.supervisor_story(evts) + "\n" + training.describe(spec, job)
        assert info.state == "COMPLETED", story
        recovered = training.supervisor_events(evts, "in_place")
        assert [(r["generation"], r["cause"], r["lost"], len(r["spares"])) for r in recovered] == [
            (1, "node_failure", [victim], 1)], story
        spare = recovered[0]["spares"][0]
        assert spare not in nodes and recovered[0]["warm"] == [spare], story    # its standby took rank 1
        training.assert_one_node_recovered_in_place(spec, job, evts, story, victim, spare, LIGHTNING)
        # rank 0's one process: every step said once, resumed at the last it said before the loss (its
        # line comes after the callback's copy of the step), past step 8's sealed checkpoint
        resumed = resumed_at(out)
        assert len(resumed) == 1 and CHECKPOINT_EVERY < resumed[0] < STEPS, out
        assert steps_said(out) == list(range(1, STEPS + 1)), out
        assert f"resuming from step {resumed[0]}, held in memory by rank 0" in training.stderr(spec, job), story
    finally:
        _restore(cluster, victim)
