"""submitit from Python on the real mini-cluster (real sacct through slurmdbd): results, a
person's requeue, and a warning signal, each ending in the reference run's exact state."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmtools.common import ledger
from slurmtools.common.control_dir import control_dir_for
from slurmtools.errors import SpecError
from slurmtools.job import notebook
from slurmtools.preflight.canary import CANARY_FAULT_ENV
from slurmtools.slurm import drain, commands as slurm
from tests.cluster import asuser, training
from tests.conftest import REPO, wait_for

pytestmark = pytest.mark.cluster
submitit = pytest.importorskip("submitit")


def spec(work: Path, **over):
    data = {"name": "nb", "nodes": 2, "processes_per_node": 1, "time_limit_min": 10,
            "cpus_per_task": training.node_cpus(),     # the whole node (training.node_cpus says why)
            "checkpoint_dir": str(work / "ckpt"), "requeue": {"warning_lead_s": 60, "checkpoint_grace_s": 30}}
    data.update(over)
    return data


def job_for(**cfg):
    """The trainer without a checkpoint dir of its own: the spec's reaches it."""
    from slurmtools.job.notebook import TinyFSDPJob
    from slurmtools.reference.tiny_model import TrainConfig
    return TinyFSDPJob(TrainConfig(steps=training.STEPS, checkpoint_every=training.CHECKPOINT_EVERY, **cfg))


def _execute(nbclient, nb, user_tmp: Path):
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(user_tmp)}}).execute()
    return nb


def control_dir(work: Path, job) -> Path:
    return control_dir_for(str(work / "ckpt"), "", str(job.job_id))


def stdout_events(job):
    out = []
    for line in Path(job.paths.stdout).read_text().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def test_bad_spec_gives_the_same_clear_error(tmp_path):
    with pytest.raises(SpecError, match="nodez: unknown key; did you mean 'nodes'"):
        notebook.executor({"name": "x", "nodez": 2}, folder=tmp_path)


@pytest.mark.every_release
def test_submit_from_python_and_get_the_result(cluster, user_tmp, reference_run):
    training.settle()
    asuser.call(_submit_and_get_the_result, user_tmp, reference_run)


def _submit_and_get_the_result(user_tmp: Path, reference_run: dict) -> None:
    """As the user, in their notebook: submit, wait for the results, ask for the status."""
    ex = notebook.executor(spec(user_tmp), folder=user_tmp / "sub" / "%j")
    job = ex.submit(job_for())
    results = job.results()
    assert len(results) == 2 and all(r["event"] == "final" for r in results)
    assert results[0]["state_sha256"] == reference_run["hash"]
    assert results[0]["world_size"] == 2
    # real sacct through slurmdbd (submitit's own watcher caches it and lags)
    ended = wait_for(lambda: [r for r in slurm.sacct_rows(int(job.job_id))
                              if r["JobID"] == str(job.job_id) and r["State"] not in training.UNENDED_STATES],
                     90, "sacct to say the job ended")
    assert ended[0]["State"] == "COMPLETED", (slurm.sacct_rows(int(job.job_id)), Path(job.paths.stderr).read_text()[-3000:])
    st = notebook.status(job, spec(user_tmp))
    assert st.progress.startswith(f"step {training.STEPS}/{training.STEPS}")
    assert "goodput" in st.goodput


@pytest.mark.every_release
def test_requeue_mid_run_resumes_from_the_checkpoint(cluster, user_tmp, reference_run):
    training.settle()
    asuser.call(_requeue_mid_run, user_tmp, reference_run)


def _requeue_mid_run(user_tmp: Path, reference_run: dict) -> None:
    """As the user: submit, requeue their own job at step 6 (scontrol requeue), wait for the results."""
    ex = notebook.executor(spec(user_tmp), folder=user_tmp / "sub" / "%j")
    job = ex.submit(job_for(step_sleep_s=0.5))
    wait_for(lambda: Path(job.paths.stdout).exists() and any(
        e.get("step", 0) >= 6 and "loss" in e for e in stdout_events(job)), 120, "step 6", interval_s=0.3)
    slurm.requeue(int(job.job_id))
    results = job.results()
    assert results[0]["state_sha256"] == reference_run["hash"]
    assert results[0]["attempt_id"] == f"{job.job_id}.1"
    evts = stdout_events(job)
    stops = [e["step"] for e in evts if e.get("event") == "stopped_for_requeue"]
    resumes = [e["step"] for e in evts if e.get("event") == "resumed"]
    assert stops and resumes == stops            # 0 steps lost
    events = ledger.read(control_dir(user_tmp, job))
    assert [event.cause for event in events if isinstance(event, ledger.AttemptEnd)] == ["preempted", "completed"]


def test_a_warning_signal_checkpoints_requeues_and_completes(cluster, user_tmp, reference_run):
    """The warning as Slurm delivers it to submitit's tasks (USR2 to every task of the job's steps),
    sent by scancel at step 6 rather than waited for: the real time limit, and Slurm's late or lost
    warning, are tests/cluster/test_faults.py's time-limit test; here it is the notebook path's
    answer to the signal that is under test."""
    training.settle()
    asuser.call(_warning_signal, user_tmp, reference_run)


def _warning_signal(user_tmp: Path, reference_run: dict) -> None:
    """As the user: submit, send the warning to their own job's steps (scancel -s USR2), wait."""
    ex = notebook.executor(spec(user_tmp), folder=user_tmp / "sub" / "%j")
    job = ex.submit(job_for(step_sleep_s=0.5))
    wait_for(lambda: Path(job.paths.stdout).exists() and any(
        e.get("step", 0) >= 6 and "loss" in e for e in stdout_events(job)), 120, "step 6", interval_s=0.3)
    slurm.cancel(int(job.job_id), "USR2")
    results = job.results()
    assert results[0]["state_sha256"] == reference_run["hash"]
    events = ledger.read(control_dir(user_tmp, job))
    causes = [event.cause for event in events if isinstance(event, ledger.AttemptEnd)]
    assert causes == ["preempted", "completed"]
    evts = stdout_events(job)
    stops = [e["step"] for e in evts if e.get("event") == "stopped_for_requeue"]
    resumes = [e["step"] for e in evts if e.get("event") == "resumed"]
    assert resumes[:len(stops)] == stops


def test_preflight_in_the_tasks_names_a_wrong_node_and_requeues_without_it(cluster, user_tmp, reference_run,
                                                                           monkeypatch):
    """node2's first device computes a wrong canary: rank 0 drains node2 and requeues the job
    without it; the next allocation passes preflight and trains to the reference state."""
    training.settle()
    monkeypatch.setenv(CANARY_FAULT_ENV, "node2")
    try:
        job, results = asuser.call(_submit_and_wait, user_tmp)
        assert results[0]["state_sha256"] == reference_run["hash"]
        assert results[0]["attempt_id"] == f"{job.job_id}.1"
        verdicts = [e for e in stdout_events(job) if e.get("slurmtools") == "preflight"]
        assert [(v["status"], v["named"]) for v in verdicts] == [("failed", ["node2"]), ("passed", [])]
        reason = training.blamed_reason("node2", int(job.job_id))
        # two devices (one a node) have no majority: node2's result misses the float64 reference
        assert reason.startswith("slurmtools: CRITICAL preflight.canary node=node2 measured=sum="), reason
        events = ledger.read(control_dir(user_tmp, job))
        assert [(e.cause, e.action, e.node) for e in events if isinstance(e, ledger.AttemptEnd)] == [
            ("preflight", "requeue", "node2"), ("completed", None, None)]
        assert [e.status for e in events if isinstance(e, ledger.PreflightCheck)] == ["failed", "passed"]
    finally:
        for node in slurm.nodes():
            if node.drained and drain.is_ours(node.reason):
                drain.resume(node.name)


def _submit_and_wait(user_tmp: Path):
    ex = notebook.executor(spec(user_tmp), folder=user_tmp / "sub" / "%j")
    job = ex.submit(job_for())
    return job, job.results()


def test_the_example_notebook_runs_top_to_bottom_in_a_real_kernel(cluster, user_tmp, reference_run_4, monkeypatch):
    """examples/notebook_fsdp.ipynb executed by a real Jupyter kernel (nbclient): the job's status is
    one display updated in place, the report is shown inline, and the result is the sbatch path's
    exact state."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    training.settle()
    for name, value in (("NOTEBOOK_WORKDIR", user_tmp / "nb"), ("NOTEBOOK_STEPS", training.STEPS),
                        ("NOTEBOOK_CHECKPOINT_EVERY", training.CHECKPOINT_EVERY)):
        monkeypatch.setenv(name, str(value))
    nb = nbformat.read(REPO / "examples" / "notebook_fsdp.ipynb", as_version=4)
    nb = asuser.call(_execute, nbclient, nb, user_tmp)      # the kernel is the user's
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert not [out for cell in code for out in cell.outputs if out["output_type"] == "error"]
    job_id = code[2].outputs[0]["text"].split()[-1]
    watched = [cell for cell in code if cell.source.startswith("final_status = watch(")][0]
    displays = [out for out in watched.outputs if out["output_type"] == "display_data"]
    assert len(displays) == 1                                             # one display, updated in place
    assert displays[0]["data"]["text/plain"].startswith(f"job {job_id}: COMPLETED")
    shown = [cell for cell in code if cell.source.startswith("show_report(")][0].outputs
    report = [out["data"]["text/html"] for out in shown if out["output_type"] == "display_data"]
    assert len(report) == 1 and report[0].startswith("<iframe srcdoc=")
    assert all(f"plot-{name}" in report[0] for name in ("timeline", "progress", "step-time", "breakdown"))
    final = code[-1].outputs[-1]["text"].splitlines()[-1]
    assert final == f"final step {training.STEPS}, state sha256 {reference_run_4['hash']}"  # its 2 x 2
