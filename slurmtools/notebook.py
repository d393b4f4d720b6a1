"""submitit from notebooks: the same JobSpec, the same checkpoint rule, the same requeue behaviour.

    ex = notebook.executor("job.yaml", folder="runs/logs/%j")      # or a JobSpec / dict
    job = ex.submit(TinyFSDPJob(TrainConfig(steps=100, checkpoint_dir="runs/ckpt")))
    print(notebook.status(job))                                   # state, progress, log tail, goodput

submitit's own preemption handler checkpoints on rank 0 only, inside the signal handler, and
other ranks ignore the signal; a sharded (FSDP) checkpoint needs every rank. CheckpointableTrainer
therefore replaces those handlers in every rank with flag-only ones: all ranks checkpoint together
at the next step boundary, then rank 0 requeues (for a warning signal) and every rank waits to
be ended by Slurm rather than returning a partial result.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from slurmtools import sbatch, slurm
from slurmtools.errors import SlurmCommandError, UsageError
from slurmtools.requeue import ledger
from slurmtools.runtime import TrainingControl, control_dir_for
from slurmtools.spec import JobSpec, load_spec, spec_from_dict

DEFAULT_TIME_LIMIT_MIN = 60
WAIT_FOR_KILL_S = 120


def _spec(spec_or_path: Union[JobSpec, Dict[str, Any], str, Path]) -> JobSpec:
    if isinstance(spec_or_path, JobSpec):
        return spec_or_path
    if isinstance(spec_or_path, dict):
        return spec_from_dict(spec_or_path)
    return load_spec(spec_or_path)


def executor_parameters(spec: JobSpec) -> Dict[str, Any]:
    """submitit parameters for a spec (pure): one task per training process, Slurm options, env."""
    params: Dict[str, Any] = {
        "name": spec.name, "nodes": spec.nodes, "tasks_per_node": spec.procs_per_node,
        "timeout_min": spec.time_limit_min or DEFAULT_TIME_LIMIT_MIN,
        "slurm_signal_delay_s": spec.requeue.warning_lead_s,
        # MASTER_PORT below the ephemeral port range (submitit's own pick can collide: EADDRINUSE)
        "slurm_setup": [f"export {k}={sbatch.q(v)}" for k, v in sbatch.environment(spec)]
        + [f"export MASTER_PORT={sbatch.master_port_expr()}"],
        "slurm_additional_parameters": {"requeue": True},
        # one dead rank ends the step instead of leaving the others waiting in rendezvous
        "slurm_srun_args": ["--kill-on-bad-exit=1"],
    }
    if spec.gpus_per_node:
        params["gpus_per_node"] = spec.gpus_per_node
    if spec.cpus_per_task is not None:
        params["cpus_per_task"] = spec.cpus_per_task
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


def executor(spec_or_path: Union[JobSpec, Dict[str, Any], str, Path], folder: Union[str, Path]) -> Any:
    """A submitit executor configured from a job spec (validated by the same rules as the sbatch path)."""
    try:
        import submitit
    except ImportError:
        raise UsageError("submitit is not installed (pip install 'slurmtools[submitit]')") from None
    spec = _spec(spec_or_path)
    ex = submitit.AutoExecutor(folder=str(folder), cluster="slurm")
    ex.update_parameters(**executor_parameters(spec))
    return ex


# ---- the training base -------------------------------------------------------------------
class _Base:
    pass


try:  # the base is usable (and importable) without submitit; submitting needs it
    from submitit.helpers import Checkpointable as _Checkpointable
except ImportError:  # pragma: no cover - exercised only where submitit is absent
    _Checkpointable = _Base  # type: ignore[misc,assignment]


class CheckpointableTrainer(_Checkpointable):  # type: ignore[misc,valid-type]
    """Subclass and implement `train(control) -> dict` returning {"event": "final", ...} or
    {"event": "stopped_for_requeue", ...}; checkpoints go through CheckpointManager and the
    process group is set up from submitit's distributed environment (MASTER_ADDR/PORT, RANK, ...)."""

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
        job_id = os.environ.get("SLURM_JOB_ID", "local")
        restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        attempt_id = f"{job_id}.{restart}"
        os.environ["SLURMTOOLS_ATTEMPT_ID"] = attempt_id
        control_dir = control_dir_for(Path(self.checkpoint_dir), job_id) if self.checkpoint_dir else None
        backend = self.backend or ("nccl" if torch.cuda.is_available() else "gloo")
        timeout_s = int(os.environ.get("SLURMTOOLS_COLLECTIVE_TIMEOUT_S", "1800"))
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
        if backend == "nccl":
            torch.cuda.set_device(env.local_rank)
        control = TrainingControl(control_dir=control_dir, rank=env.rank)
        control.install_signal_handlers()   # replaces submitit's rank-0-only handlers in every rank
        if env.rank == 0 and control_dir is not None:
            ledger.append(control_dir, {"event": "start", "attempt_id": attempt_id, "t": time.time(),
                                        "restart": restart, "nodes": os.environ.get("SLURM_JOB_NODELIST", ""),
                                        "resume_step": _latest_step(self.checkpoint_dir)})
        try:
            outcome = self.train(control)
        except Exception:
            self._record_end(control_dir, env.rank, attempt_id, "crash", None)
            raise
        if outcome.get("event") == "final":
            self._record_end(control_dir, env.rank, attempt_id, "completed", outcome.get("step"))
            dist.barrier()
            dist.destroy_process_group()
            return outcome
        self._record_end(control_dir, env.rank, attempt_id, "preempted", outcome.get("step"))
        dist.barrier()
        warned = control.signal_names() & {"SIGUSR1", "SIGUSR2"}
        if env.rank == 0 and warned and "SIGTERM" not in control.signal_names():
            try:
                slurm.requeue(int(job_id))       # a warning: we requeue; a SIGTERM: Slurm already is
            except (SlurmCommandError, ValueError) as exc:
                print(f"slurmtools: requeue failed: {exc}", file=sys.stderr, flush=True)
        _wait_to_be_ended()
        return outcome

    @staticmethod
    def _record_end(control_dir: Optional[Path], rank: int, attempt_id: str, cause: str, step: Optional[int]) -> None:
        if rank != 0 or control_dir is None:
            return
        from slurmtools.requeue import watchdog
        beats = watchdog.read_heartbeats(control_dir)
        ledger.append(control_dir, {"event": "end", "attempt_id": attempt_id, "t": time.time(), "cause": cause,
                                    "counted": cause not in ("completed", "preempted"),
                                    "last_step": max((b.step for b in beats), default=step),
                                    "first_step_t": watchdog.first_progress(beats),
                                    "checkpoint_step": step if cause != "crash" else None})


def _latest_step(checkpoint_dir: Optional[str]) -> Optional[int]:
    if not checkpoint_dir:
        return None
    from slurmtools.checkpoint import CheckpointManager
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
    job_id: str
    state: str
    progress: Optional[str]
    log_tail: List[str]
    goodput: Optional[str]

    def __str__(self) -> str:
        lines = [f"job {self.job_id}: {self.state}" + (f" - {self.progress}" if self.progress else "")]
        if self.goodput:
            lines.append(self.goodput)
        if self.log_tail:
            lines.append("--- log tail ---")
            lines.extend(self.log_tail)
        return "\n".join(lines)


def status(job: Any, *, checkpoint_dir: Optional[str] = None, tail_lines: int = 5) -> JobStatus:
    """State from squeue/sacct through slurmtools (not submitit's lagging sacct cache), the newest
    progress line, the log tail and, when the requeue ledger exists, goodput."""
    from slurmtools.jobs import progress_from_log

    job_id = str(job.job_id)
    try:
        info = slurm.job_state(int(job_id))
        state = info.state + (f" (restarts={info.restarts})" if info.restarts else "")
    except SlurmCommandError:
        state = "UNKNOWN"
    text = ""
    try:
        text = Path(job.paths.stdout).read_text(errors="replace")
    except OSError:
        pass
    lines = [ln for ln in text.splitlines() if ln.strip()]
    good = None
    if checkpoint_dir:
        records = ledger.read(control_dir_for(Path(checkpoint_dir), job_id))
        if records:
            g = ledger.goodput(records)
            good = f"goodput {g.ratio:.1%} over {g.attempts} attempt(s), steps lost {g.steps_lost or [0]}"
    return JobStatus(job_id, state, progress_from_log(text), lines[-tail_lines:], good)
