"""What a training loop needs from slurmtools, for any trainer: heartbeats, checkpoint requests,
a completion marker and the attempt id. No torch import at module level.

This module is the one contract between the job's parts (the generated script, the
supervisor, the submitit path and the trainer):

  control dir   <checkpoint_dir or output_dir>/.slurmtools/<job id>, on the shared filesystem,
                kept across requeues; exported to the trainer as SLURMTOOLS_CONTROL_DIR:
    heartbeat/<rank>.json   each rank's last step and its time (the hang watchdog), `alive` (a
                            thread's, in collectives too: the node-death watch), `busy_s` (stragglers)
    checkpoint-request      the supervisor wants a checkpoint now (a warning, a straggler's swap)
    stopped-for-requeue     written by rank 0 after it checkpointed on request
    complete                written by rank 0 when training has finished
    silent-data-corruption  written by rank 0 when the SDC canary found ranks disagreeing
    gpu-events/node-<host>.json  XIDs the node's GPUs reported while it ran (gpu_events.py)
    ledger.jsonl            the attempts of the job (requeue/ledger.py)
    steps/<attempt id>.rank<N>.jsonl
                            each rank's finished steps and rank 0's checkpoints (steplog.py),
                            what `slurmtools report` plots
    flight-recorder/<attempt id>/rank_<N>
                            NCCL flight-recorder dumps after a collective timeout;
                            rank_<N>.json, node-<host>.json: dumps reduced on request (fr_dump.py)
  attempt id    "<job id>.<restart count>", and "<job id>.<restart count>.<step seq>" for a
                restart inside the allocation (SLURMTOOLS_ATTEMPT_ID); the attempt's number
                across the whole job, from 0, in SLURMTOOLS_ATTEMPT_NUMBER
  checkpoints   the spec's checkpoint_dir (SLURMTOOLS_CHECKPOINT_DIR)
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple, Union

from slurmtools.errors import UsageError
from slurmtools.fsutil import write_json_atomic
from slurmtools.gpu_events import GpuEventWatch
from slurmtools.node_beat import NodeBeats
from slurmtools.node_sweep import LOCAL_JOB_ID as LOCAL_JOB_ID    # one source: the sweep reads job ids from names
from slurmtools.rank_output import whole_lines
from slurmtools.signals import SignalFlags

CONTROL_DIR_ENV = "SLURMTOOLS_CONTROL_DIR"
ATTEMPT_ID_ENV = "SLURMTOOLS_ATTEMPT_ID"
ATTEMPT_NUMBER_ENV = "SLURMTOOLS_ATTEMPT_NUMBER"
CHECKPOINT_DIR_ENV = "SLURMTOOLS_CHECKPOINT_DIR"
COLLECTIVE_TIMEOUT_ENV = "SLURMTOOLS_COLLECTIVE_TIMEOUT_S"
CHECKPOINT_GRACE_ENV = "SLURMTOOLS_CHECKPOINT_GRACE_S"
# the newest checkpoint step the ledger records (checkpoint_resume.refuse_fresh_start)
EXPECTED_CHECKPOINT_ENV = "SLURMTOOLS_EXPECTED_CHECKPOINT_STEP"
# the job's node count at its first run (requeue/step.job_nodes: Slurm's requeue keeps a shrunk one)
JOB_NODES_FILE = "job-nodes"
WARNING_LEAD_ENV = "SLURMTOOLS_WARNING_LEAD_S"      # notebook path: rank 0 keeps the warning clock
CONTROL_SUBDIR = ".slurmtools"

HEARTBEAT_DIR = "heartbeat"
HEARTBEAT_INTERVAL_S = 1.0     # a rank's keep-alive thread: how often `alive` is refreshed and markers looked at
FLIGHT_RECORDER_DIR = "flight-recorder"
# where torch writes its flight-recorder dump (the rank is appended): torch >= 2.7 and older names
FLIGHT_RECORDER_FILE_ENVS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
# present when the supervisor wants every rank's flight recorder dumped (a hang to attribute)
FLIGHT_RECORDER_REQUEST_FILE = "flight-recorder-request"
REQUEST_FILE = "checkpoint-request"
COMPLETE_FILE = "complete"
SDC_FILE = "silent-data-corruption"     # rank 0: the canary's verdict (slurmtools.sdc)
PREFLIGHT_REPORT_FILE = "preflight.json"  # rank 0 of the preflight step: its report (slurmtools.preflight)
SDC_CHECK_EVERY_ENV = "SLURMTOOLS_SDC_CHECK_EVERY"   # the spec's distributed.sdc_check_every
SNAPSHOT_EVERY_ENV = "SLURMTOOLS_SNAPSHOT_EVERY"     # distributed.snapshot_every_steps (docs/snapshots.md)
SNAPSHOT_MEMORY_GB_ENV = "SLURMTOOLS_SNAPSHOT_MEMORY_GB"   # distributed.snapshot_memory_gb
SNAPSHOT_MAX_OVERHEAD_ENV = "SLURMTOOLS_SNAPSHOT_MAX_OVERHEAD_PCT"   # distributed.snapshot_max_overhead_pct
PREFLIGHT_ENV = "SLURMTOOLS_PREFLIGHT"   # notebook path: the spec's preflight settings (JSON); unset: off
STOPPED_FILE = "stopped-for-requeue"
# Slurm's SIGTERM came, recorded before any save (slurm_view.close_dangling_attempt: not counted)
TERM_FILE = "term-received"
# made by every TrainingControl: the program reports its progress (without it, exit 0 is completion)
REPORTS_PROGRESS_FILE = "reports-progress"
# how long a rank may stay in a phase (saving, verifying) without a step before it counts as hung
DEFAULT_PHASE_TIMEOUT_S = 1800.0
# signals a trainer turns into a checkpoint request: Slurm ending or requeueing the job
# (SIGTERM, also forwarded by torchrun) and the time-limit / preemption warning (USR1/USR2)
CHECKPOINT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)

PathLike = Union[str, Path]


def flight_recorder_prefix(control_dir: PathLike, attempt_id: str) -> str:
    """Where a rank's flight-recorder dump goes, the rank appended: torch's own on an NCCL
    timeout (the supervisor exports it as FLIGHT_RECORDER_FILE_ENVS) and ours on request."""
    return f"{control_dir}/{FLIGHT_RECORDER_DIR}/{attempt_id}/rank_"


def control_root(checkpoint_dir: Optional[str], output_dir: str) -> str:
    """The directory holding every job's control dir: beside the checkpoints, else the logs."""
    base = (checkpoint_dir or output_dir).rstrip("/") or "/"
    return f"{base}/{CONTROL_SUBDIR}" if base != "/" else f"/{CONTROL_SUBDIR}"


def control_dir_for(checkpoint_dir: Optional[str], output_dir: str, job_id: str) -> Path:
    return Path(control_root(checkpoint_dir, output_dir)) / job_id


def default_control_dir(environ: Mapping[str, str]) -> Path:
    """Where `slurmtools run` keeps its files when the script names no control dir."""
    return Path(CONTROL_SUBDIR) / environ.get("SLURM_JOB_ID", LOCAL_JOB_ID)


def attempt_number(environ: Mapping[str, str]) -> int:
    """This attempt's number across the job (restarts in place and requeues), from 0."""
    text = environ.get(ATTEMPT_NUMBER_ENV, "")
    if text.isascii() and text.isdigit():
        return int(text)
    return attempt_of(environ)[1]


def attempt_of(environ: Mapping[str, str]) -> Tuple[Optional[int], int, str]:
    """(job id or None outside Slurm, restart count, attempt id) from Slurm's variables."""
    job_text = environ.get("SLURM_JOB_ID", "")
    job_id = int(job_text) if job_text.isascii() and job_text.isdigit() else None
    restart_text = environ.get("SLURM_RESTART_COUNT", "0") or "0"
    restart = int(restart_text) if restart_text.isascii() and restart_text.isdigit() else 0
    return job_id, restart, f"{job_id if job_id is not None else LOCAL_JOB_ID}.{restart}"


class TrainingControl:
    """One per training process. Works (as a no-op) outside the supervisor too."""

    def __init__(self, control_dir: Optional[PathLike] = None, rank: Optional[int] = None,
                 heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S) -> None:
        env_dir = os.environ.get(CONTROL_DIR_ENV)
        self.control_dir = Path(control_dir) if control_dir else (Path(env_dir) if env_dir else None)
        self.rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        self.attempt_id = os.environ.get(ATTEMPT_ID_ENV) or attempt_of(os.environ)[2]
        self.heartbeat_interval_s = heartbeat_interval_s
        self._last_beat = 0.0
        self._last_step: Optional[int] = None
        self._first_step: Optional[int] = None
        self._first_progress_t: Optional[float] = None
        self._flags: Optional[SignalFlags] = None
        self._record: Optional[Dict[str, Any]] = None
        self._lock = threading.Lock()
        self._alive_thread: Optional[threading.Thread] = None
        self._busy_s = 0.0
        self._dumped = False
        self._metrics: Optional[Any] = None      # metrics.StepMetrics when SLURMTOOLS_METRICS_DIR is set
        self._metrics_checked = False
        self._steplog: Optional[Any] = None      # steplog.StepLog, made at the first step_done
        self._steplog_off = False
        self._phase: Optional[Tuple[str, float]] = None    # (name, deadline): TrainingControl.phase
        self._node: Optional[NodeBeats] = None     # heartbeats gathered per node (slurmtools.node_beat)
        if self.control_dir is not None:
            whole_lines()          # under torchrun's `python -u`, ranks' lines merged mid-line otherwise
            (self.control_dir / HEARTBEAT_DIR).mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                (self.control_dir / REPORTS_PROGRESS_FILE).touch()
            self._node = NodeBeats.for_rank(self.control_dir, self.rank, socket.gethostname(), self.attempt_id,
                                            os.environ, (REQUEST_FILE, FLIGHT_RECORDER_REQUEST_FILE))
            GpuEventWatch.for_rank(self.control_dir, self.rank, socket.gethostname(), self.attempt_id, os.environ)

    @contextlib.contextmanager
    def busy(self, synchronize: Optional[Callable[[], None]] = None) -> Iterator[None]:
        """Time work that waits for no other rank (e.g. a sharded model's optimizer step).
        Heartbeats carry the total: collectives make every step as long as the slowest rank's,
        so only this names a straggling rank. GPU work is queued, not done, when the Python call
        returns: pass synchronize (e.g. torch.cuda.synchronize) and it runs before the clock stops."""
        start = time.monotonic()
        try:
            yield
            if synchronize is not None:
                synchronize()
        finally:
            self._busy_s += time.monotonic() - start

    @property
    def metrics_on(self) -> bool:
        """Whether the job set SLURMTOOLS_METRICS_DIR (the Prometheus textfile)."""
        if not self._metrics_checked:
            from slurmtools import metrics
            self._metrics_checked = True
            self._metrics = metrics.step_metrics_for(self.rank, self.attempt_id, os.environ)
        return self._metrics is not None

    @property
    def records_steps(self) -> bool:
        """Whether anyone reads step_done's numbers: the step log in the control dir (`slurmtools
        report`) or the Prometheus textfile. A trainer can skip measuring (a GPU synchronisation
        to read the loss, say) when this is false."""
        return self.control_dir is not None or self.metrics_on

    def step_done(self, step: int, step_s: float, *, tokens: Optional[int] = None, loss: Optional[float] = None,
                  grad_norm: Optional[float] = None, collective_s: Optional[float] = None,
                  data_wait_s: Optional[float] = None) -> None:
        """The numbers of a finished step: into the control dir's step log (slurmtools.steplog)
        and, when the job set SLURMTOOLS_METRICS_DIR, the Prometheus textfile (slurmtools.metrics).
        A file that cannot be written turns that record off for this process: numbers never
        stop training."""
        from slurmtools.steplog import as_number, plausible, plausible_measurements
        step, step_s = as_number(step), as_number(step_s)      # numpy and torch scalars too
        if not plausible(step, step_s):          # not a step we can account (a negative or absurd number)
            return
        measured = plausible_measurements({name: as_number(value) for name, value in (
            ("tokens", tokens), ("loss", loss), ("grad_norm", grad_norm), ("collective_s", collective_s),
            ("data_wait_s", data_wait_s))})
        self._open_step_log()
        if self._steplog is not None:
            try:
                self._steplog.step(step, step_s, **measured)
            except OSError as exc:
                self._steplog_failed(exc)
        if not self.metrics_on or self._metrics is None:
            return
        from slurmtools.metrics import StepSample
        try:
            self._metrics.record(StepSample(step, step_s, **measured))
        except OSError as exc:
            print(f"slurmtools: metrics off for rank {self.rank}: {exc}", file=sys.stderr, flush=True)
            self._metrics = None

    def checkpoint_done(self, step: int, save_s: float, *, requested: bool = False) -> None:
        """A checkpoint this rank saved (call it on rank 0): the report's timeline shows it."""
        self._open_step_log()
        if self._steplog is not None:
            try:
                self._steplog.checkpoint(step, save_s, requested=requested)
            except OSError as exc:
                self._steplog_failed(exc)

    def _open_step_log(self) -> None:
        if self.control_dir is not None and self._steplog is None and not self._steplog_off:
            from slurmtools.steplog import StepLog
            node = self._node
            self._steplog = StepLog(self.control_dir, self.attempt_id, self.rank, socket.gethostname(),
                                    node_dir=node.directory if node else None, gathers=bool(node and node.gathers))

    def _steplog_failed(self, exc: OSError) -> None:
        print(f"slurmtools: step log off for rank {self.rank}: {exc}", file=sys.stderr, flush=True)
        self._steplog, self._steplog_off = None, True

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGUSR1/2 only set a flag; the loop checkpoints at the next step boundary.
        A warning held back since start-up (signals.block_warning_signals) is handled now."""
        if self._flags is None:
            self._flags = SignalFlags().install(CHECKPOINT_SIGNALS)

    def signal_names(self) -> Set[str]:
        """Names of the signals received so far (e.g. {"SIGUSR2"})."""
        return set(self._flags.names()) if self._flags is not None else set()

    @contextlib.contextmanager
    def phase(self, name: str, timeout_s: float = DEFAULT_PHASE_TIMEOUT_S) -> Iterator[None]:
        """Long work between steps (saving, verifying a checkpoint): while it lasts, and for at most
        timeout_s, the watchdog takes no silence for a hang; past timeout_s it does (a save that
        truly hangs is still found). The heartbeat says which phase, from when, until when."""
        if not 0 < timeout_s < float("inf"):     # its deadline goes into the heartbeat's JSON
            raise UsageError(f"phase {name!r}: timeout_s must be a finite number of seconds above 0, got {timeout_s!r}")
        now = time.time()
        with self._lock:
            self._phase = (name, now + timeout_s)
            if self._record is None:        # before the first step (verifying on resume)
                self._record = {"rank": self.rank, "host": socket.gethostname(), "step": 0, "time": now,
                                "first_progress_t": None, "attempt_id": self.attempt_id, "busy_s": 0.0}
            self._record["phase_t"] = now   # a phase's start and end are signs of work, like a step
            self._write(now)
        self._start_keep_alive()
        try:
            yield
        finally:
            with self._lock:
                self._phase = None
                end = time.time()
                if self._record is not None:
                    self._record["phase_t"] = end
                self._write(end)

    def heartbeat(self, step: int, *, force: bool = False, defer: bool = False) -> None:
        """Liveness signal: written whenever the step changes (the watchdog finds the laggard by
        step), otherwise at most once per interval. Call it at the top of each step. With defer
        the keep-alive thread writes it within heartbeat_interval_s (the framework adapters: no
        file written on the training thread each step; hang timeouts are minutes)."""
        now = time.time()
        if self.control_dir is None:
            return
        if not force and step == self._last_step and now - self._last_beat < self.heartbeat_interval_s:
            return
        self._last_beat = now
        self._last_step = step
        if self._first_step is None:
            self._first_step = step
        elif step > self._first_step and self._first_progress_t is None:
            self._first_progress_t = now      # the first step this attempt completed (goodput)
        record = {"rank": self.rank, "host": socket.gethostname(), "step": step, "time": now,
                  "first_progress_t": self._first_progress_t, "attempt_id": self.attempt_id,
                  "busy_s": round(self._busy_s, 6)}
        with self._lock:
            self._record = record
            if not defer or self._alive_thread is None:
                self._write(now)
        self._start_keep_alive()

    def _start_keep_alive(self) -> None:
        if self._alive_thread is None and self.control_dir is not None:
            self._alive_thread = threading.Thread(target=self._keep_alive, name="slurmtools-alive", daemon=True)
            self._alive_thread.start()

    def _write(self, now: float) -> None:
        if self.control_dir is None or self._record is None:
            return
        phase = {"phase": self._phase[0], "phase_until": self._phase[1]} if self._phase else {}
        record = dict(self._record, alive=now, **phase)
        try:
            if self._node is not None:
                self._node.write(record, self.control_dir / HEARTBEAT_DIR, now)
            else:
                write_json_atomic(self.control_dir / HEARTBEAT_DIR / f"{self.rank}.json", record, durable=False)
        except OSError:
            pass    # a full or vanished control dir must not kill training; the watchdog sees silence

    def _keep_alive(self) -> None:
        """While the process lives, `alive` stays fresh, also while the loop waits in a collective
        (torch releases the GIL there): silence of every rank on a node means the node is gone.
        Asked to, it dumps the flight recorder once (which collective this rank entered last)."""
        while True:
            time.sleep(self.heartbeat_interval_s)
            with self._lock:
                self._write(time.time())
            if not self._dumped and self.control_dir is not None and self._marker(FLIGHT_RECORDER_REQUEST_FILE):
                self._dumped = True
                self._dump_flight_recorder(self.control_dir)

    def _dump_flight_recorder(self, control_dir: Path) -> None:
        """This rank's flight recorder, reduced to what attribution reads (slurmtools.fr_dump)."""
        try:
            from slurmtools.fr_dump import this_process_summary
            record = this_process_summary(self.rank)
            if record is None:
                return
            prefix = os.environ.get(FLIGHT_RECORDER_FILE_ENVS[0]) or flight_recorder_prefix(control_dir, self.attempt_id)
            Path(prefix).parent.mkdir(parents=True, exist_ok=True)
            if self._node is not None:
                self._node.write_flight_record(record, Path(prefix).parent)
            else:
                write_json_atomic(Path(f"{prefix}{self.rank}.json"), record, durable=False)
        except Exception as exc:      # evidence only: never a reason for training to fail
            print(f"slurmtools: flight-recorder dump failed: {exc}", file=sys.stderr, flush=True)

    def checkpoint_requested(self) -> bool:
        """This rank's view; use `slurmtools.agreement` so every rank acts at the same step."""
        if self._flags is not None and self._flags.any():
            return True
        return self._marker(REQUEST_FILE)

    def _marker(self, name: str) -> bool:
        """A supervisor's marker: in node memory where the node's heartbeats are gathered."""
        if self._node is not None:
            return self._node.marker_exists(name)
        return self.control_dir is not None and (self.control_dir / name).exists()

    def flush_metrics(self, last: bool = False) -> None:
        """The last steps' numbers now (both records write at most every few seconds); last: this
        rank ends training (its node's step lines are taken: node_steps.py)."""
        if self._steplog is not None:
            try:
                self._steplog.flush(last)
            except OSError as exc:
                self._steplog_failed(exc)
        if self._metrics is not None:
            try:
                self._metrics.flush()
            except OSError:
                self._metrics = None

    def mark_stopped_for_requeue(self, step: int) -> None:
        self.flush_metrics(last=True)
        if self.control_dir is not None and self.rank == 0:
            write_json_atomic(self.control_dir / STOPPED_FILE, {"step": step, "attempt_id": self.attempt_id})

    def mark_sdc(self, step: int, ranks: List[int], node: Optional[str], detail: str,
                 nodes: Sequence[str] = ()) -> None:
        """The canary found ranks computing wrong results: the supervisor blames node (and nodes)."""
        if self.control_dir is not None and self.rank == 0:
            write_json_atomic(self.control_dir / SDC_FILE, {"step": step, "ranks": ranks, "node": node, "detail": detail,
                                                            "nodes": list(nodes), "attempt_id": self.attempt_id})

    def checkpoints_refused(self, refused: Sequence[Tuple[str, str]]) -> None:
        """Newer checkpoints the resume passed over ((path, why), as load_latest returns them):
        into the job's ledger, where they stay after the quarantined directory is cleaned up."""
        if self.control_dir is not None and self.rank == 0:
            from slurmtools.requeue import ledger
            for path, why in refused:
                ledger.append(self.control_dir, ledger.CheckpointRefused(self.attempt_id, time.time(), path, why))

    def mark_complete(self, step: int) -> None:
        self.flush_metrics(last=True)
        if self.control_dir is not None and self.rank == 0:
            write_json_atomic(self.control_dir / COMPLETE_FILE, {"step": step, "attempt_id": self.attempt_id})
