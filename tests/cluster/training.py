"""Helpers for cluster tests that run the tiny FSDP trainer through the real sbatch path."""
from __future__ import annotations

import copy
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence

import pytest

from slurmtools.common import ledger
from slurmtools.common.control_dir import control_dir_for
from slurmtools.common.fsutil import json_lines
from slurmtools.job import submit as jobs
from slurmtools.minicluster.layout import whole_node_task_cpus
from slurmtools.slurm import commands as slurm
from slurmtools.spec import JobSpec, spec_from_dict
from tests.cluster import asuser
from tests.conftest import REPO, TEST_CLUSTER_NAME, TEST_STATE_DIR, wait_for

TRAIN = REPO / "examples" / "tiny_fsdp" / "train.py"
LIGHT = REPO / "examples" / "light" / "train.py"      # no torch: the control plane alone
STEPS = 20
CHECKPOINT_EVERY = 4
# the data loader in each rank's own process: worker processes (the trainer's default, 2) cost two
# more forked processes per rank on a 2-core machine running three lanes; the batches are the same
# (test_faults.py::test_b runs with them, tests/unit/test_trainer_state.py resumes them exactly)
LOADER_WORKERS = 0
# The preflight step (4 processes importing torch: a quarter of an attempt's CPU on 2 cores) runs in
# the jobs that test it or must show it names no healthy node: the reference run (on every release),
# tests/cluster/test_preflight.py, the notebook's jobs and the fault matrix's start-up kill; the other
# fault tests start training at once (preflight=True turns it on).
PREFLIGHT = False
# The launcher of the fault tests that do not test torchrun itself (test_recovery, the fault matrix,
# preflight, observability, test_faults' tests without a signal): srun starts the ranks as Slurm's
# tasks, with no torchrun agent per node importing torch (~1.9 CPU-s each; a tenth of the test
# command's CPU, docs/minicluster.md R105). The reference run, test_faults' signals (the time-limit
# warning, a person's requeue and cancels, a slow stop), node and host kills and hang, test_training,
# the frameworks, the plain script and confinement keep torchrun: both launchers stay under faults.
FAULT_LAUNCHER = "srun"


@functools.lru_cache(maxsize=None)
def node_cpus() -> int:
    """CPUs of one node of the suite's cluster: a test job's torchrun task takes them all, as a
    production training job takes whole nodes. Each mini-cluster node is this machine, and Slurm
    gives a 1-CPU task the lowest free CPU: with 1 CPU per task every job process of every lane
    (supervisor, srun, torchrun, ranks) was confined to CPU 0 while CPU 1 idled -- test_recovery a
    took 107 s in a full run against 37 s alone, the CPUs 55% busy (docs/minicluster.md)."""
    from slurmtools.minicluster import cluster as mc
    return mc.find_layout(TEST_CLUSTER_NAME, TEST_STATE_DIR).cpus_per_node


# in-memory snapshots at every step, exactly: the default bound on a snapshot's stall (1% of training
# time) would space these tiny steps' snapshots out (tests/unit/test_snapshot_gloo.py tests the bound)
SNAPSHOTS_EVERY_STEP = {"snapshot_every_steps": 1, "snapshot_memory_gb": 1, "snapshot_max_overhead_pct": 0}
# sacct states of a job that has not ended yet (its accounting row still changes)
UNENDED_STATES = frozenset({"PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "COMPLETING", ""})


def _merge(base: Dict[str, Any], over: Dict[str, Any]) -> Dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def training_spec(workdir: Path, name: str, *, steps: int = STEPS, extra: Sequence[str] = (),
                  loader_workers: int = LOADER_WORKERS, preflight: bool = PREFLIGHT, **over: Any) -> JobSpec:
    """2 nodes x 1 process on CPU; checkpoint every 4 steps into workdir/ckpt. One rank a node
    unless a test needs a second: the test command is bound by its CPU work, and a run's CPU is
    mostly its processes starting (torch imported by every rank: 36 CPU-s for 2 x 2, 15 for 2 x 1)."""
    data = {
        "name": name, "nodes": 2, "processes_per_node": 1, "python": sys.executable,
        "command": [str(TRAIN), "--steps", str(steps), "--checkpoint-every", str(CHECKPOINT_EVERY),
                    "--loader-workers", str(loader_workers), *extra],
        "output_dir": str(workdir / "logs"), "checkpoint_dir": str(workdir / "ckpt"), "time_limit_min": 10,
        "requeue": {"hang_timeout_s": 120, "backoff_s": 0, "warning_lead_s": 60, "checkpoint_grace_s": 30},
        "preflight": preflight,
        # in-memory snapshots (on by default) off: these tests assert resumes from checkpoints; the
        # snapshot tests turn them on (SNAPSHOTS_EVERY_STEP)
        "distributed": {"snapshot_every_steps": 0},
    }
    merged = _merge(data, over)
    if "cpus_per_task" not in merged:       # the whole node: torchrun's one task, or srun's task per process
        merged["cpus_per_task"] = whole_node_task_cpus(node_cpus(), merged.get("launcher", "torchrun"),
                                                       merged["processes_per_node"])
    return spec_from_dict(merged)


def fault_spec(workdir: Path, name: str, **over: Any) -> JobSpec:
    """training_spec launched by FAULT_LAUNCHER: a fault test that does not test torchrun itself."""
    return training_spec(workdir, name, launcher=FAULT_LAUNCHER, **over)


def load_spec_file(path: Path) -> JobSpec:
    from slurmtools.spec import load_spec
    return load_spec(path)


def submit(spec: JobSpec) -> int:
    """The spec submitted by the cluster's ordinary user, as `slurmtools submit` does it."""
    return asuser.call(jobs.submit_spec, spec, slurmtools_cmd=[sys.executable, "-m", "slurmtools"])


def _wait_finished(job: int, timeout_s: float) -> slurm.JobInfo:
    seen: List[slurm.JobInfo] = []

    def done():
        info = slurm.job_state(job)
        seen[:] = [info]
        return info if info.finished else None
    try:
        return wait_for(done, timeout_s, f"job {job} to finish")
    except BaseException as exc:
        # where it stuck: a pending job's reason and the nodes' states say why it never ran
        last = seen[0] if seen else None
        nodes = "; ".join(f"{n.name} {n.display_state} {n.reason}".strip() for n in slurm.nodes())
        ended = ("timed out after {:g} s".format(timeout_s) if isinstance(exc, pytest.fail.Exception)
                 else f"failed ({type(exc).__name__}: {exc})")
        pytest.fail(f"{ended} waiting for job {job} to finish: last "
                    f"{last.state if last else None} reason={last.reason if last else None} "
                    f"nodes={last.nodes if last else None}; cluster: {nodes}")


def wait_finished(job: int, timeout_s: float) -> slurm.JobInfo:
    """Followed by its user (squeue, then sacct once it left the queue)."""
    return asuser.call(_wait_finished, job, timeout_s)


def cancel(job: int, signal: str = "") -> None:
    """By its user."""
    asuser.call(slurm.cancel, job, *([signal] if signal else []))


def warn(job: int, signal: str = "USR1") -> None:
    """The time-limit warning as Slurm sends it (--signal=B:USR1@lead: the batch step only), by its user."""
    asuser.call(slurm.cancel, job, signal, batch_only=True)


def requeue(job: int) -> None:
    """By its user (a person's `scontrol requeue` of their own job)."""
    asuser.call(slurm.requeue, job)


def cancel_all() -> None:
    """Every job left in the queue, by its user (all of the suite's jobs are the user's)."""
    for job in slurm.run_slurm(["squeue", "-h", "-o", "%i"]).split():
        cancel(int(job))


def submit_script(script: str) -> int:
    """A plain batch script submitted by the user."""
    return asuser.call(slurm.submit, script)


def output(spec: JobSpec, job: int) -> str:
    path = Path(spec.output_dir) / f"{spec.name}-{job}.out"
    return path.read_text() if path.exists() else ""


def stderr(spec: JobSpec, job: int) -> str:
    path = Path(spec.output_dir) / f"{spec.name}-{job}.err"
    return path.read_text() if path.exists() else ""


def events(spec: JobSpec, job: int) -> List[Dict[str, Any]]:
    return json_lines(output(spec, job))


def _trainers(job: int, program: Path):
    """(process, its environment) of each process running program for this job on any node of this
    suite's cluster (scripts/test.sh runs other clusters beside it, whose job ids are the same numbers).
    A spare's warm standby (slurmtools.train.standby) started with a rank its go replaces: none here."""
    import os

    import psutil
    conf = os.environ.get("SLURM_CONF")
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmdline = p.info["cmdline"] or []
            env = p.environ() if str(program) in cmdline else {}
            if env.get("SLURM_JOB_ID") == str(job) and env.get("SLURM_CONF") == conf:
                if "slurmtools.train.standby" in cmdline:
                    env.pop("RANK", None)
                yield p, env
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue


def leftover_trainers(job: int, program: Path = TRAIN) -> List[int]:
    """Pids of training processes of this job still alive (orphans)."""
    return [p.pid for p, _ in _trainers(job, program)]


def rank_pids(job: int, program: Path = TRAIN) -> Dict[str, List[int]]:
    """Pids of this job's ranks running program, by their RANK (a rank restarted in place may
    show two for a moment: its old process and its new one)."""
    found: Dict[str, List[int]] = {}
    for process, env in _trainers(job, program):
        if env.get("RANK"):
            found.setdefault(env["RANK"], []).append(process.pid)
    return found


def rank_pid(job: int, rank: int, program: Path = TRAIN) -> int:
    """The one process of this job's rank running program."""
    found = rank_pids(job, program).get(str(rank), [])
    assert len(found) == 1, found
    return found[0]


def kill_ranks_on(job: int, node: str, program: Path = TRAIN) -> List[int]:
    """SIGKILL the training ranks (launched processes with a LOCAL_RANK, not torchrun's agent) of
    this job on node, as a GPU fault ends its process; their pids."""
    import signal

    import psutil
    killed = []
    for p, env in _trainers(job, program):
        if env.get("SLURMD_NODENAME") == node and "LOCAL_RANK" in env:
            try:
                p.send_signal(signal.SIGKILL)
                killed.append(p.pid)
            except psutil.NoSuchProcess:
                continue
    return killed


def supervisor_events(evts: List[Dict[str, Any]], kind: str) -> List[Dict[str, Any]]:
    return [e for e in evts if e.get("slurmtools") == kind]


def supervisor_story(evts: List[Dict[str, Any]]) -> str:
    """The supervisor's events, one line each, without their per-node maps (128 nodes' busy times
    would push the decisions out of an assertion message): what it saw and did, in order."""
    return "\n".join(json.dumps({key: value for key, value in e.items()
                                 if not isinstance(value, dict) and len(str(value)) <= 400})
                     for e in evts if "slurmtools" in e)


def trainer_events(evts: List[Dict[str, Any]], kind: str) -> List[Dict[str, Any]]:
    return [e for e in evts if e.get("event") == kind]


def max_step(spec: JobSpec, job: int) -> int:
    return max((e["step"] for e in events(spec, job) if "loss" in e), default=0)


def wait_step(spec: JobSpec, job: int, step: int, timeout_s: float = 180) -> None:
    """The job's first start (queue, prolog, torchrun, every rank importing torch) and its steps: a
    2 x 2 job beside the other lane's unit tests took over 90 s to reach step 6 (R45)."""
    wait_for(lambda: max_step(spec, job) >= step, timeout_s, f"job {job} to reach step {step}", interval_s=0.2)


def describe(spec: JobSpec, job: int) -> str:
    """Output and stderr tail, for assertion messages."""
    return output(spec, job)[-3000:] + "\n--- stderr ---\n" + stderr(spec, job)[-3000:]


def all_idle() -> bool:
    return all(n.state == "idle" and not n.flags for n in slurm.nodes())


def settle(timeout_s: float = 60) -> None:
    """Wait until no job is left and every node is idle (tests share one cluster); a blame an
    earlier test's job reported is handled now and its drain lifted, so it cannot land later."""
    def idle() -> bool:
        lift_blame_drains()
        return all_idle()
    wait_for(idle, timeout_s, "all nodes idle", interval_s=0.5)
    time.sleep(0.2)


def lift_blame_drains() -> None:
    """Handle the blames waiting in the suite cluster's spool now (as the HealthCheckProgram would),
    then resume every node drained with our prefix (as an admin would, between tests)."""
    from slurmtools.slurm import drain
    from slurmtools.blame import intake
    from slurmtools.health.config import load_config
    from slurmtools.minicluster import cluster as mc
    layout = mc.find_layout(TEST_CLUSTER_NAME, TEST_STATE_DIR)
    intake.handle(load_config(str(layout.health_config)).for_host("node1").blame)
    for node in slurm.nodes():
        if node.drained and drain.is_ours(node.reason):
            drain.resume(node.name)


def blamed_reason(node: str, job: int, timeout_s: float = 30) -> str:
    """The reason the root-owned blame path drained node with (the supervisor only reports it;
    the cluster's HealthCheckProgram or the next prolog/epilog drains): it names the job's user
    and the job, and the report was handled as the job's user's."""
    import pwd
    from slurmtools.minicluster import cluster as mc
    from slurmtools.blame import spool

    info = wait_for(lambda: [n for n in slurm.nodes(node) if n.drained and n.reason.startswith("slurmtools:")],
                    timeout_s, f"{node} drained by the blame path")[0]
    uid = int(slurm.sacct_rows(job, ("JobID", "UID"))[0]["UID"])
    user = pwd.getpwuid(uid).pw_name
    assert user == asuser.user().name, f"job {job} ran as {user}, not the cluster's ordinary user"
    from slurmtools.slurm import drain
    reason = drain.without_slurm_notes(info.reason)     # 24.11+ append " : Not responding" to a dead node's
    assert reason.endswith(f" user={user} job={job}"), info.reason
    layout = mc.find_layout(TEST_CLUSTER_NAME, TEST_STATE_DIR)
    records = [r for r in spool.records(layout.blame_spool / spool.DONE_DIR)
               if r.get("job") == str(job) and r.get("node") == node and r.get("action") == "drain"]
    assert records and records[0]["uid"] == uid, records
    return reason


def assert_one_node_recovered_in_place(spec: JobSpec, job: int, evts: List[Dict[str, Any]], story: str,
                                       victim: str, spare: str, program: Path = TRAIN) -> None:
    """The job's lost node recovered in place, never relaunched: one step of Slurm's, one decision
    (completed), the ledger's in-place record and its one counted node failure, no requeue, no
    process of the job left."""
    assert [s["attempt_id"] for s in supervisor_events(evts, "start")] == [f"{job}.0"], story
    assert [(d["cause"], d["action"]) for d in supervisor_events(evts, "decision")] == [
        ("completed", "complete")], story
    control = control_dir_for(spec.checkpoint_dir, spec.output_dir, str(job))
    survived = [e for e in ledger.read(control) if isinstance(e, ledger.InPlaceRecovery)]
    assert [(e.generation, e.lost, e.spares) for e in survived] == [(1, victim, spare)]
    assert [(r.cause.value, r.counted) for r in ledger.history(ledger.read(control))] == [
        ("node_failure", True), ("completed", False)]
    assert slurm.job_state(job).restarts == 0
    assert leftover_trainers(job, program) == []
