"""Your own trainer (issue 30): PyTorch Lightning and Hugging Face Transformers' Trainer with the
slurmtools adapters (examples/lightning, examples/transformers: 4 and 3 lines), on the real
libraries, 2 nodes x 1 process and a spare. One job per framework, three failures in a row:
a framework checkpoint cut off mid-write (planted, with a higher step than any sealed one) is
never resumed from; the time-limit warning is turned into a framework checkpoint, the job
requeues and resumes at that very step; a node killed under training is replaced by the spare
and training resumes from the newest sealed checkpoint; then it completes."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import pytest

from slurmtools.slurm import commands as slurm
from slurmtools.spec import JobSpec, spec_from_dict
from tests.cluster import asuser, training
from tests.cluster.test_fault_matrix import _completed_with_a_node_killed, _start_nodes, decisions
from tests.conftest import wait_for
from tests.example_output import resumed_at, steps_said

pytestmark = [pytest.mark.cluster]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS = 40


def _spec(workdir: Path, framework: str) -> JobSpec:
    return spec_from_dict({
        "name": framework, "nodes": 2, "processes_per_node": 1, "python": sys.executable,
        "cpus_per_task": training.node_cpus(),      # the whole node (training.node_cpus says why)
        "command": [str(EXAMPLES / framework / "train.py"), "--steps", str(STEPS), "--checkpoint-every", "4",
                    "--step-sleep-s", "0.5"],
        "output_dir": str(workdir / "logs"), "checkpoint_dir": str(workdir / "ckpt"), "time_limit_min": 10,
        "preflight": False,     # tested elsewhere; 9 s of every batch run here
        "requeue": {"spare_nodes": 1, "backoff_s": 0, "hang_timeout_s": 120, "warning_lead_s": 60,
                    "checkpoint_grace_s": 30, **OWN_CHECKPOINTS[framework](workdir / "ckpt")},
    })


OWN_CHECKPOINTS: "dict[str, Callable[[Path], dict]]" = {
    "lightning": lambda ckpt: {},          # sealed as slurmtools' own step_N: the supervisor reads them
    # the Trainer's checkpoint-N, sealed in place: named for the supervisor's decisions
    "transformers": lambda ckpt: {"progress_checkpoints": str(ckpt / "checkpoint-*"),
                                  "progress_checkpoint_marker": "MANIFEST.json"},
}


def _last_step(spec: JobSpec, job: int) -> int:
    return max(steps_said(training.output(spec, job)), default=0)


def _resumed(spec: JobSpec, job: int) -> "list[int]":
    return resumed_at(training.output(spec, job))


CUT_OFF: "dict[str, Callable[[Path], Path]]" = {
    # what each framework leaves when killed mid-save, with a step past any the job will reach
    "lightning": lambda ckpt: ckpt / "step_1000.tmp",
    "transformers": lambda ckpt: ckpt / "checkpoint-1000",
}


# one in each lane of scripts/test.sh (about 2 minutes each; 3 nodes are enough for either)
# one in each lane of scripts/test.sh (about 2 minutes each; 3 nodes are enough for either: the
# node is killed after the requeue, so no later run needs it)
@pytest.mark.parametrize("framework", [pytest.param("lightning", marks=pytest.mark.matrix), "transformers"])
def test_a_frameworks_trainer_survives_a_cut_off_checkpoint_the_warning_and_a_lost_node(cluster, workdir, framework):
    spec = _spec(workdir, framework)
    job = training.submit(spec)
    wait_for(lambda: _last_step(spec, job) >= 10, 180, f"job {job} to train to step 10", interval_s=0.2)
    asuser.call(_plant, CUT_OFF[framework](workdir / "ckpt"))
    training.warn(job)
    wait_for(lambda: len(_resumed(spec, job)) >= 1 and _last_step(spec, job) >= _resumed(spec, job)[0] + 4, 240,
             f"job {job} to requeue, resume and train 4 steps", interval_s=0.2)
    victim, evts = _completed_with_a_node_killed(cluster, spec, job, 300)
    assert decisions(evts) == [("preempted", "requeue"), ("node_failure", "restart"), ("completed", "complete")], \
        training.describe(spec, job)
    preempted, lost, _done = training.supervisor_events(evts, "decision")
    assert victim not in _start_nodes(evts)[2] and slurm.job_state(job).restarts == 1
    resumed = _resumed(spec, job)
    # the requeue resumed at the step the warning's checkpoint was taken, the spare from the
    # newest sealed checkpoint; the cut-off one (step 1000) never
    assert resumed == [preempted["checkpoint_step"], lost["checkpoint_step"]], training.describe(spec, job)
    assert 1000 not in resumed and preempted["checkpoint_step"] == preempted["last_step"]
    assert f"step {STEPS}/{STEPS}" in training.output(spec, job)


def _plant(path: Path) -> None:
    path.mkdir(parents=True)
    (path / ("model.ckpt" if path.name.startswith("step_") else "model.safetensors")).write_bytes(b"cut off")
