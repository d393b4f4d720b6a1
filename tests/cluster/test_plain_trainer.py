"""A plain torchrun DDP script (examples/plain_ddp: no slurmtools import, its own torch.save
checkpoints) under the supervisor (issue 30): a crash after progress restarts it in the
allocation (a crash, never a user error for want of heartbeats), a node killed under it is found
by its slurmd not answering and replaced by the spare, and its exit 0 completes the job. Its
progress is seen through its own checkpoints and lines (requeue.progress_*). On the 5-node
cluster of lane 2 (marker matrix), beside the fault matrix."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from slurmtools.slurm import commands as slurm
from slurmtools.spec import JobSpec, spec_from_dict
from tests.cluster import training
from tests.cluster.test_fault_matrix import _completed_with_a_node_killed, _start_nodes, decisions
from tests.conftest import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.matrix]

PLAIN = Path(__file__).resolve().parents[2] / "examples" / "plain_ddp" / "train.py"
STEPS = 14


def _spec(workdir: Path) -> JobSpec:
    ckpt = workdir / "ckpt"
    return spec_from_dict({
        "name": "plain", "nodes": 2, "processes_per_node": 1, "python": sys.executable,
        "cpus_per_task": training.node_cpus(),      # the whole node (training.node_cpus says why)
        "command": [str(PLAIN), "--steps", str(STEPS), "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2",
                    "--step-sleep-s", "1", "--crash-once-at-step", "3"],
        "output_dir": str(workdir / "logs"), "time_limit_min": 10,
        "requeue": {"spare_nodes": 1, "backoff_s": 0, "hang_timeout_s": 120,
                    "progress_checkpoints": str(ckpt / "step_*.pt"), "progress_log_pattern": r"^step (\d+)/"},
    })


def _steps_after_restart(spec: JobSpec, job: int) -> int:
    text = training.output(spec, job)
    after = text.split("resumed from step_2.pt", 1)
    return max((int(n) for n in re.findall(r"^step (\d+)/", after[1], re.M)), default=0) if len(after) == 2 else 0


def test_a_plain_script_survives_a_crash_after_progress_and_a_node_kill(cluster, workdir):
    spec = _spec(workdir)
    job = training.submit(spec)
    wait_for(lambda: _steps_after_restart(spec, job) >= 6, 150,
             f"job {job}'s restart after its crash at step 3 to train to step 6", interval_s=0.2)
    victim, evts = _completed_with_a_node_killed(cluster, spec, job, 240)
    # rank 0's exit 3 is a crash; the other rank's gloo "Connection closed by peer", when it gets
    # to print it before srun ends it, reads as a collective failure: restarted and counted alike
    steps = decisions(evts)
    assert steps[0] in (("crash", "restart"), ("collective_timeout", "restart")), training.describe(spec, job)
    assert steps[1:] == [("node_failure", "restart"), ("completed", "complete")], training.describe(spec, job)
    crash, lost, done = training.supervisor_events(evts, "decision")
    # judged by its own checkpoint (step_2.pt) and progress line (step 3), not by heartbeats
    assert (crash["checkpoint_step"], crash["last_step"]) == (2, 3)
    assert lost["node"] == victim and lost["checkpoint_step"] >= 6
    assert victim not in _start_nodes(evts)[2] and slurm.job_state(job).restarts == 0   # the spare, in place
    out = training.output(spec, job)
    resumed = re.findall(r"^resumed from step_(\d+)\.pt at step \d+ on (\d+) ranks$", out, re.M)
    assert resumed == [("2", "2"), (str(lost["checkpoint_step"]), "2")], resumed
    assert f"trained {STEPS} steps" in out
    assert done["reason"] == "training completed"
