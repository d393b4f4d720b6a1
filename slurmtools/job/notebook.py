"""submitit from notebooks: the same JobSpec, the same checkpoint rule, the same requeue behaviour.

    spec = {"name": "nb", "nodes": 2, "processes_per_node": 2, "checkpoint_dir": "runs/ckpt"}
    ex = notebook.executor(spec, folder="runs/logs/%j")          # or a YAML path / a JobSpec
    job = ex.submit(TinyFSDPJob(TrainConfig(steps=100)))          # checkpoints go to the spec's dir
    print(notebook.status(job, spec))                             # state, progress, log tail, goodput

What the notebook path honours: every Slurm field (nodes, gpus_per_node, processes_per_node,
cpus_per_task, mem_gb, time_limit_min, partition, account, qos, constraint, reservation,
exclude, nodelist, container_image), `python` (the interpreter of the tasks), env, network,
distributed, checkpoint_dir, requeue.warning_lead_s and requeue.checkpoint_grace_s. It always
runs one task per training process (what `launcher: srun` means). What it cannot honour is
refused when set to anything but its default (NOT_HONOURED): the program is the submitted
callable (not `command`), logs go to the executor's folder (not `output_dir`), and the
failure budget and the in-allocation recovery of `slurmtools run` (spares, fewer nodes, node
death, stragglers) do not exist here (submitit resubmits on preemption).

submitit's own preemption handler checkpoints on rank 0 only, inside the signal handler, and
other ranks ignore the signal; a sharded (FSDP) checkpoint needs every rank. CheckpointableTrainer
therefore replaces those handlers in every rank with flag-only ones: all ranks checkpoint together
at the next step boundary, then rank 0 requeues (for a warning signal) and every rank waits to
be ended by Slurm rather than returning a partial result. Tasks start through
slurmtools.job.task_start, which holds the warning pending until those handlers exist.
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from slurmtools.common import ledger
from slurmtools.common.control_dir import (ATTEMPT_ID_ENV, CHECKPOINT_DIR_ENV, CHECKPOINT_GRACE_ENV,
                                           LOCAL_JOB_ID, PREFLIGHT_ENV, WARNING_LEAD_ENV,
                                           attempt_of, collective_timeout_s, control_dir_for)
from slurmtools.common.rendezvous import SHELL_PORT_EXPR
from slurmtools.common.signals import WARNING_SIGNAL_NAMES, signal_number
from slurmtools.errors import SlurmCommandError, SpecError, UsageError
from slurmtools.job import sbatch
from slurmtools.requeue import preflight_inprocess as inprocess
from slurmtools.requeue import goodput
from slurmtools.requeue.deadline import WarningClock
from slurmtools.slurm import commands as slurm
from slurmtools.spec import JobSpec, load_spec, spec_from_dict
from slurmtools.train.control import TrainingControl

SpecLike = Union[JobSpec, Dict[str, Any], str, Path]
DEFAULT_TIME_LIMIT_MIN = 60
WAIT_FOR_KILL_S = 120
# fields the submitit path cannot honour: any value but the default is refused
NOT_HONOURED = ("command", "launcher", "output_dir", "requeue.max_restarts", "requeue.restart_window_h",
                "requeue.max_consecutive_failures",
                "requeue.warning_signal", "requeue.hang_timeout_s", "requeue.first_step_timeout_s",
                "requeue.startup_timeout_s", "requeue.no_progress_restarts",
                "requeue.backoff_s", "requeue.retry_oom", "requeue.spare_nodes", "requeue.min_nodes",
                "requeue.node_timeout_s", "requeue.straggler_factor", "requeue.straggler_windows",
                "requeue.straggler_window_steps", "requeue.direct_drain")
_DEFAULT_PYTHON = "python3"


def load(spec_or_path: SpecLike) -> JobSpec:
    """A job spec from a JobSpec, a dict of its keys, or a YAML file's path, validated."""
    if isinstance(spec_or_path, JobSpec):
        return spec_or_path
    if isinstance(spec_or_path, dict):
        return spec_from_dict(spec_or_path)
    return load_spec(spec_or_path)


def _field_default(cls: Any, name: str) -> Any:
    field = {f.name: f for f in dataclasses.fields(cls)}[name]
    if field.default is dataclasses.MISSING and field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def refuse_unhonoured(spec: JobSpec) -> None:
    """A one-line SpecError for the first field set to a value this path cannot honour."""
    for key in NOT_HONOURED:
        owner: Any = spec
        cls: Any = JobSpec
        *parents, name = key.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
            cls = type(owner)
        if key == "launcher" and spec.launcher == "srun":
            continue   # what this path does anyway
        if getattr(owner, name) != _field_default(cls, name):
            raise SpecError("is not honoured by the notebook (submitit) path; remove it, or submit the spec "
                            "with `slurmtools submit`", key=key)


def executor_parameters(spec: JobSpec) -> Dict[str, Any]:
    """submitit parameters for a spec (pure): one task per training process, Slurm options, env."""
    refuse_unhonoured(spec)
    exports = sbatch.environment(spec) + [(CHECKPOINT_GRACE_ENV, str(spec.requeue.checkpoint_grace_s)),
                                          (WARNING_LEAD_ENV, str(spec.requeue.warning_lead_s))]
    preflight_settings = inprocess.env_value(spec)
    if preflight_settings is not None:
        exports.append((PREFLIGHT_ENV, preflight_settings))
    params: Dict[str, Any] = {
        "name": spec.name, "nodes": spec.nodes, "tasks_per_node": spec.procs_per_node,
        "timeout_min": spec.time_limit_min or DEFAULT_TIME_LIMIT_MIN,
        "slurm_signal_delay_s": spec.requeue.warning_lead_s,
        # MASTER_PORT random and below the ephemeral port range (submitit's own pick can collide:
        # EADDRINUSE; one derived from the job id is known to every user: slurmtools.common.rendezvous)
        "slurm_setup": [f"export {name}={sbatch.q(value)}" for name, value in sorted(exports)]
        + [f"export MASTER_PORT={SHELL_PORT_EXPR}"],
        "slurm_additional_parameters": {"requeue": True},
        # one dead rank ends the step instead of leaving the others waiting in rendezvous
        "slurm_srun_args": ["--kill-on-bad-exit=1"],
    }
    if spec.gpus_per_node:
        params["gpus_per_node"] = spec.gpus_per_node
    task_cpus = spec.cpus_per_task or 1          # one task per training process here
    params["cpus_per_task"] = task_cpus
    params["slurm_srun_args"] += [f"--cpus-per-task={task_cpus}", "--cpu-bind=cores"]   # see sbatch.py
    if spec.mem_gb is not None:
        params["mem_gb"] = spec.mem_gb
    for key in ("partition", "qos", "constraint", "exclude", "nodelist", "account"):
        value = getattr(spec, key)
        if value is not None:
            params[f"slurm_{key}"] = value
    if spec.reservation:
        params["slurm_additional_parameters"]["reservation"] = spec.reservation
    if spec.container_image:
        params["slurm_srun_args"].append(f"--container-image={spec.container_image}")
    return params


def task_python(spec: JobSpec) -> str:
    """The command submitit runs each task with (it appends `-u -m submitit.core._submit FOLDER`)."""
    python = sys.executable if spec.python == _DEFAULT_PYTHON else spec.python
    return f"{shlex.quote(python)} -u -m slurmtools.job.task_start"


def executor(spec_or_path: SpecLike, folder: Union[str, Path]) -> Any:
    """A submitit executor configured from a job spec (validated by the same rules as the sbatch path)."""
    try:
        import submitit
    except ImportError:
        raise UsageError("submitit is not installed (pip install 'slurmtools[submitit]')") from None
    spec = load(spec_or_path)
    params = executor_parameters(spec)
    ex = submitit.AutoExecutor(folder=str(folder), cluster="slurm", slurm_python=task_python(spec))
    ex.update_parameters(**params)
    return ex


# ---- the training base -------------------------------------------------------------------
class _Base:
    pass


try:  # the base is usable (and importable) without submitit; submitting needs it
    from submitit.helpers import Checkpointable as _Checkpointable
except ImportError:  # pragma: no cover - exercised only where submitit is absent
    _Checkpointable = _Base  # type: ignore[misc,assignment]


class CheckpointableTrainer(_Checkpointable):
    """Subclass and implement `train(control) -> dict` returning {"event": "final", ...} or
    {"event": "stopped_for_requeue", ...}; checkpoints go through CheckpointManager into
    `self.checkpoint_dir` (default: the spec's checkpoint_dir) and the process group is set up
    from submitit's distributed environment (MASTER_ADDR/PORT, RANK, ...)."""

    checkpoint_dir: Optional[str] = None
    backend: Optional[str] = None

    def train(self, control: TrainingControl) -> Dict[str, Any]:
        raise NotImplementedError

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit's protocol: resubmit this same trainer; its state lives in the checkpoints."""
        import submitit
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)

    def __call__(self) -> Any:
        import datetime

        import submitit
        import torch
        import torch.distributed as dist

        dist_env = submitit.helpers.TorchDistributedEnvironment()   # reads our MASTER_PORT (see setup)
        os.environ.pop("MASTER_PORT", None)                         # export() refuses to overwrite it
        env = dist_env.export()
        _, restart, attempt_id = attempt_of(os.environ)
        job_id = os.environ.get("SLURM_JOB_ID", LOCAL_JOB_ID)
        os.environ[ATTEMPT_ID_ENV] = attempt_id
        self.checkpoint_dir = self.checkpoint_dir or os.environ.get(CHECKPOINT_DIR_ENV) or None
        control_dir = control_dir_for(self.checkpoint_dir, "", job_id) if self.checkpoint_dir else None
        if env.rank == 0 and control_dir is not None:
            ledger.append(control_dir, ledger.AttemptStart(attempt_id, time.time(), restart,
                                                           os.environ.get("SLURM_JOB_NODELIST", ""),
                                                           _latest_step(self.checkpoint_dir)))
        if not inprocess.before_training(os.environ, env.rank, job_id, attempt_id, control_dir):
            _wait_to_be_ended()         # requeued without the nodes preflight named
        backend = self.backend or ("nccl" if torch.cuda.is_available() else "gloo")
        timeout_s = collective_timeout_s(os.environ)
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
        if backend == "nccl":
            torch.cuda.set_device(env.local_rank)
        control = TrainingControl(control_dir=control_dir, rank=env.rank)
        control.install_signal_handlers()   # replaces submitit's handlers in every rank; unblocks the warning
        finished = threading.Event()
        if env.rank == 0:
            _start_grace_timer(control, job_id, finished)
        try:
            outcome = self.train(control)
        except Exception:
            self._record_end(control_dir, env.rank, attempt_id, "crash", None)
            raise
        finally:
            finished.set()
        if outcome.get("event") == "final":
            self._record_end(control_dir, env.rank, attempt_id, "completed", outcome.get("step"))
            dist.barrier()
            dist.destroy_process_group()
            return outcome
        self._record_end(control_dir, env.rank, attempt_id, "preempted", outcome.get("step"))
        dist.barrier()
        warned = control.signal_names() & WARNING_SIGNAL_NAMES
        if env.rank == 0 and warned and "SIGTERM" not in control.signal_names():
            _requeue(job_id)       # a warning: we requeue; a SIGTERM: Slurm already is
        _wait_to_be_ended()
        return outcome

    @staticmethod
    def _record_end(control_dir: Optional[Path], rank: int, attempt_id: str, cause: str, step: Optional[int]) -> None:
        if rank != 0 or control_dir is None:
            return
        from slurmtools.requeue import watchdog
        beats = watchdog.read_heartbeats(control_dir)
        ledger.append(control_dir, ledger.AttemptEnd(
            attempt_id=attempt_id, time_s=time.time(), cause=cause, counted=cause not in ("completed", "preempted"),
            last_step=max((beat.step for beat in beats), default=step),
            first_step_t=watchdog.first_progress(beats), checkpoint_step=step if cause != "crash" else None,
            last_step_t=watchdog.last_progress(beats)))


class TinyFSDPJob(CheckpointableTrainer):
    """The reference trainer (slurmtools.reference.tiny_fsdp) as a submitit callable:
    `executor.submit(TinyFSDPJob(TrainConfig(...)))`; checkpoints go to the spec's checkpoint_dir
    unless the TrainConfig names one."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.checkpoint_dir = cfg.checkpoint_dir

    def train(self, control: TrainingControl) -> Dict[str, Any]:
        from slurmtools.reference.tiny_fsdp import train
        return train(dataclasses.replace(self.cfg, checkpoint_dir=self.checkpoint_dir), control)


def _requeue(job_id: str) -> None:
    try:
        slurm.requeue(int(job_id))
    except (SlurmCommandError, ValueError) as exc:
        print(f"slurmtools: requeue failed: {exc}", file=sys.stderr, flush=True)


def _start_grace_timer(control: TrainingControl, job_id: str, finished: threading.Event) -> None:
    """Rank 0 keeps the warning clock (slurmtools.requeue.deadline: Slurm's warning can be lost) and,
    requeue.checkpoint_grace_s after a warning, requeues anyway (as the sbatch path's supervisor
    does), so a stuck save never eats the rest of the allocation."""
    grace_s = float(os.environ.get(CHECKPOINT_GRACE_ENV, "0") or 0)
    lead_s = float(os.environ.get(WARNING_LEAD_ENV, "0") or 0)
    clock = WarningClock(int(job_id), lead_s) if lead_s > 0 and job_id.isdigit() else None

    def watch() -> None:
        while not finished.wait(0.5):
            warned = control.signal_names() & WARNING_SIGNAL_NAMES
            if not warned and not control.signal_names() and clock is not None and clock.due(time.time()):
                print(f"slurmtools: {lead_s:g} s left and no warning from Slurm; acting as warned",
                      file=sys.stderr, flush=True)
                os.kill(os.getpid(), _submitit_warning_signal())   # agree() carries it to every rank
                continue
            if warned:
                if grace_s > 0 and not finished.wait(grace_s):
                    print(f"slurmtools: checkpoint not done {grace_s:g} s after the warning; requeueing",
                          file=sys.stderr, flush=True)
                    _requeue(job_id)
                return

    if grace_s > 0 or clock is not None:
        threading.Thread(target=watch, name="slurmtools-grace", daemon=True).start()


def _submitit_warning_signal() -> int:
    """The signal submitit asks Slurm for (--signal=USR2@slurm_signal_delay_s unless overridden)."""
    from submitit.slurm.slurm import SlurmJobEnvironment
    return signal_number(SlurmJobEnvironment.USR_SIG)


def _latest_step(checkpoint_dir: Optional[str]) -> Optional[int]:
    if not checkpoint_dir:
        return None
    from slurmtools.checkpoint.manager import CheckpointManager
    latest = CheckpointManager(checkpoint_dir).latest(checksums=False)
    return latest.step if latest else None


def _wait_to_be_ended() -> None:
    """After a requeue Slurm ends every task; returning instead would report a partial result."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    deadline = time.time() + WAIT_FOR_KILL_S
    while time.time() < deadline:
        time.sleep(0.5)
    raise SystemExit("slurmtools: the requeue did not end this task in time")


# ---- notebook-friendly status -------------------------------------------------------------------
@dataclass(frozen=True)
class JobStatus:
    """What `status` found: the job's id and Slurm state, its newest progress line, its log's tail."""

    job_id: str
    state: str
    progress: Optional[str]
    log_tail: List[str]
    goodput: Optional[str]
    finished: bool = False         # Slurm says the job ended (COMPLETING is not yet)

    def __str__(self) -> str:
        lines = [f"job {self.job_id}: {self.state}" + (f" - {self.progress}" if self.progress else "")]
        if self.goodput:
            lines.append(self.goodput)
        if self.log_tail:
            lines.append("--- log tail ---")
            lines.extend(self.log_tail)
        return "\n".join(lines)


def status(job: Any, spec: Optional[SpecLike] = None, *, tail_lines: int = 5) -> JobStatus:
    """State from squeue/sacct through slurmtools (not submitit's lagging sacct cache), the newest
    progress line, the log tail and, when the spec has a checkpoint_dir, goodput from the ledger."""
    from slurmtools.job.submit import progress_from_log

    job_id = str(job.job_id)
    finished = False
    try:
        info = slurm.job_state(int(job_id))
        state = info.state + (f" (restarts={info.restarts})" if info.restarts else "")
        finished = info.finished
    except SlurmCommandError:
        state = "UNKNOWN"
    text = ""
    try:
        text = Path(job.paths.stdout).read_text(errors="replace")
    except OSError:
        pass
    lines = [line for line in text.splitlines() if line.strip()]
    good = None
    checkpoint_dir = load(spec).checkpoint_dir if spec is not None else None
    if checkpoint_dir:
        events = ledger.read(control_dir_for(checkpoint_dir, "", job_id))
        if events:
            result = goodput.goodput(events)
            good = f"goodput {result.ratio:.1%} over {result.attempts} attempt(s), steps lost {result.steps_lost or [0]}"
    return JobStatus(job_id, state, progress_from_log(text), lines[-tail_lines:], good, finished)
