"""The example FSDP2 job through the real sbatch path: render -> submit -> supervisor -> torchrun."""
from __future__ import annotations

import json

from pathlib import Path

import pytest

from slurmtools.checkpoint.manager import CheckpointManager
from slurmtools.minicluster import cluster as mc
from slurmtools.minicluster import faults
from slurmtools.slurm import commands as slurm
from tests.cluster import asuser, training

pytestmark = pytest.mark.cluster


@pytest.mark.every_release
def test_two_nodes_train_to_completion(reference_run):
    spec, evts = reference_run["spec"], reference_run["events"]
    steps = [e for e in evts if "loss" in e]
    assert [e["step"] for e in steps] == list(range(1, training.STEPS + 1))
    assert all(e["world_size"] == 2 for e in steps)
    assert all(e["attempt_id"] == f"{reference_run['job']}.0" for e in steps)
    first, last = float.fromhex(steps[0]["loss"]), float.fromhex(steps[-1]["loss"])
    assert last < first * 0.8, (first, last)
    latest = CheckpointManager(spec.checkpoint_dir).latest()
    assert latest is not None and latest.step == training.STEPS and latest.manifest["world_size"] == 2
    decision = training.supervisor_events(evts, "decision")
    assert [(d["cause"], d["action"]) for d in decision] == [("completed", "complete")]
    assert slurm.job_state(reference_run["job"]).state == "COMPLETED"
    # submitted and run by the cluster's ordinary user, never root
    assert slurm.sacct_rows(reference_run["job"], ("JobID", "UID"))[0]["UID"] == str(asuser.user().uid)


@pytest.mark.every_release
def test_rendered_job_ran_on_two_nodes(reference_run):
    start = training.supervisor_events(reference_run["events"], "start")
    assert len(start) == 1 and start[0]["nodes"].startswith("node[")


@pytest.mark.every_release
def test_cli_submit_wait_status_and_logs(cluster, user_tmp: Path):
    import sys

    spec_file = user_tmp / "job.yaml"
    spec_file.write_text(
        f"name: cli-job\nnodes: 1\nprocesses_per_node: 1\ncpus_per_task: {training.node_cpus()}\n"
        f"python: {sys.executable}\n"
        f"command: [{training.TRAIN}, --steps, '4', --checkpoint-every, '2']\n"
        f"output_dir: {user_tmp}/logs\ncheckpoint_dir: {user_tmp}/ckpt\n")
    # --json (the plain output: the getting-started walk): the id at once, the end on a line of its own
    proc = asuser.run([sys.executable, "-m", "slurmtools", "submit", str(spec_file), "--wait", "--json"], timeout=180)
    assert proc.returncode == 0, proc.stderr
    first, last = [json.loads(line) for line in proc.stdout.splitlines()]
    job = first["job_id"]
    assert first == {"job_id": job} and last == {"job_id": job, "state": "COMPLETED", "exit_code": "0:0"}
    assert f"job {job}: RUNNING" in proc.stderr
    status = asuser.run([sys.executable, "-m", "slurmtools", "status", str(job), "--json"])
    assert '"state": "COMPLETED"' in status.stdout
    logs = asuser.run([sys.executable, "-m", "slurmtools", "logs", str(job)])
    assert '"event": "final"' in logs.stdout
    bad = asuser.run([sys.executable, "-m", "slurmtools", "status", "abc"])
    assert (bad.returncode, bad.stderr.strip()) == (2, "slurmtools: error: not a job id: 'abc'")


def test_submit_wait_and_the_supervisor_ride_through_a_controller_restart(cluster, user_tmp: Path, reference_run):
    """slurmctld stops and starts again mid-run (`minicluster restart-controller`): `submit --wait`
    keeps following, the supervisor's Slurm calls retry, and training ends in the reference state."""
    import subprocess
    import sys

    training.settle()
    spec_file = user_tmp / "job.yaml"
    spec_file.write_text(
        f"name: ctld\nnodes: 2\nprocesses_per_node: 1\ncpus_per_task: {training.node_cpus()}\n"
        f"python: {sys.executable}\n"
        f"command: [{training.TRAIN}, --steps, '{training.STEPS}', --checkpoint-every, "
        f"'{training.CHECKPOINT_EVERY}', --step-sleep-s, '0.5']\n"
        f"output_dir: {user_tmp}/logs\ncheckpoint_dir: {user_tmp}/ckpt\ntime_limit_min: 10\n"
        "requeue: {hang_timeout_s: 120, backoff_s: 0, warning_lead_s: 60, checkpoint_grace_s: 30}\n")
    waiter = asuser.popen([sys.executable, "-m", "slurmtools", "submit", str(spec_file), "--wait"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert waiter.stdout is not None
    job = int(waiter.stdout.readline().strip())
    spec = training.load_spec_file(spec_file)
    training.wait_step(spec, job, 2)
    faults.restart_controller(cluster)
    out, err = waiter.communicate(timeout=240)
    assert waiter.returncode == 0, err
    assert f"job {job}: COMPLETED exit=0:0" in err.splitlines()[-1]
    finals = training.trainer_events(training.events(spec, job), "final")
    assert finals and finals[-1]["state_sha256"] == reference_run["hash"], training.describe(spec, job)
    assert [e["action"] for e in training.supervisor_events(training.events(spec, job), "decision")] == ["complete"]


@pytest.mark.every_release
def test_expedited_requeue_is_asked_exactly_where_the_release_has_it(cluster, user_tmp: Path):
    """expedite_requeue renders --requeue=expedite on 25.11+ (the mini-cluster enables it there),
    a plain --requeue before; the job's record says which it got."""
    spec = training.training_spec(user_tmp, "expedite", steps=2, expedite_requeue=True)
    job = training.submit(spec)
    expedited = (slurm.show_job(job) or {}).get("ExpeditedRequeue")
    training.wait_finished(job, 180)
    assert expedited == ("Yes" if slurm.release() >= (25, 11) else None)
    assert slurm.job_state(job).state == "COMPLETED"
