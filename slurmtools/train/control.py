"""What a training loop needs from slurmtools, for any trainer: heartbeats, checkpoint requests,
a completion marker and the attempt id. No torch import at module level. The names of the files it
writes, and of the environment it reads, are the control dir's (slurmtools/common/control_dir.py).
"""
from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from slurmtools.common.control_dir import (ATTEMPT_ID_ENV, CHECKPOINT_SIGNALS, COMPLETE_FILE, CONTROL_DIR_ENV,
                                           FLIGHT_RECORDER_FILE_ENVS, FLIGHT_RECORDER_REQUEST_FILE, HEARTBEAT_DIR,
                                           HEARTBEAT_INTERVAL_S, REPORTS_PROGRESS_FILE, REQUEST_FILE, SDC_FILE,
                                           STOPPED_FILE, PathLike, attempt_of, flight_recorder_prefix)
from slurmtools.common.fsutil import write_json_atomic
from slurmtools.common.signals import SignalFlags
from slurmtools.errors import UsageError
from slurmtools.train.gpu_events import GpuEventWatch
from slurmtools.train.node_beat import NodeBeats
from slurmtools.train.rank_output import whole_lines

DEFAULT_PHASE_TIMEOUT_S = 1800.0


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
        self._node: Optional[NodeBeats] = None     # heartbeats gathered per node (slurmtools.train.node_beat)
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
            from slurmtools.train import metrics
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
        """The numbers of a finished step: into the control dir's step log (slurmtools.train.steplog)
        and, when the job set SLURMTOOLS_METRICS_DIR, the Prometheus textfile (slurmtools.train.metrics).
        A file that cannot be written turns that record off for this process: numbers never
        stop training."""
        from slurmtools.train.steplog import as_number, plausible, plausible_measurements
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
        from slurmtools.train.metrics import StepSample
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
            from slurmtools.train.steplog import StepLog
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
        """This rank's flight recorder, reduced to what attribution reads (slurmtools.train.fr_dump)."""
        try:
            from slurmtools.train.fr_dump import this_process_summary
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
        """This rank's view; use `slurmtools.train.agreement` so every rank acts at the same step."""
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
        """Every rank, after the requested checkpoint of step: the supervisor requeues or restarts the
        job instead of counting a failure (rank 0 writes the marker)."""
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
            from slurmtools.common import ledger
            for path, why in refused:
                ledger.append(self.control_dir, ledger.CheckpointRefused(self.attempt_id, time.time(), path, why))

    def mark_complete(self, step: int) -> None:
        """Every rank, once training finished at step and its final checkpoint is saved: the job
        completes (rank 0 writes the marker; a non-zero exit after it is teardown's)."""
        self.flush_metrics(last=True)
        if self.control_dir is not None and self.rank == 0:
            write_json_atomic(self.control_dir / COMPLETE_FILE, {"step": step, "attempt_id": self.attempt_id})
