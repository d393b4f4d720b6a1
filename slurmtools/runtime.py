"""What a training loop needs from slurmtools, for any trainer: heartbeats, checkpoint requests,
a completion marker and the attempt id. No torch import here; collective agreement is opt-in.

The supervisor (`slurmtools run`) exports SLURMTOOLS_CONTROL_DIR, a directory on the shared
checkpoint filesystem that every rank can see:
  heartbeat/<rank>.json   each rank's last step and time (the hang watchdog reads the mtimes)
  checkpoint-request      present when the supervisor wants a checkpoint now (warning signal)
  complete                written by rank 0 when training has finished
"""
from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any, Dict, Optional

from slurmtools.requeue.signals import SignalFlags

CONTROL_DIR_ENV = "SLURMTOOLS_CONTROL_DIR"
HEARTBEAT_DIR = "heartbeat"
REQUEST_FILE = "checkpoint-request"
COMPLETE_FILE = "complete"
STOPPED_FILE = "stopped-for-requeue"


def control_dir_for(checkpoint_dir: Path, chain_id: str) -> Path:
    return Path(checkpoint_dir) / ".slurmtools" / chain_id


def _write_small(path: Path, data: Dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)


class TrainingControl:
    """One per training process. Works (as a no-op) outside the supervisor too."""

    def __init__(self, control_dir: Optional[Path] = None, rank: Optional[int] = None,
                 heartbeat_interval_s: float = 1.0) -> None:
        env_dir = os.environ.get(CONTROL_DIR_ENV)
        self.control_dir = Path(control_dir) if control_dir else (Path(env_dir) if env_dir else None)
        self.rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        self.attempt_id = os.environ.get("SLURMTOOLS_ATTEMPT_ID", "local.0")
        self.heartbeat_interval_s = heartbeat_interval_s
        self._last_beat = 0.0
        self._last_step: Optional[int] = None
        self._first_step: Optional[int] = None
        self._first_progress_t: Optional[float] = None
        self._flags: Optional[SignalFlags] = None
        if self.control_dir is not None:
            (self.control_dir / HEARTBEAT_DIR).mkdir(parents=True, exist_ok=True)

    def install_signal_handlers(self) -> None:
        """SIGTERM (Slurm ending or requeueing the job, torchrun forwarding) and SIGUSR1/2 (warning)
        only set a flag; the loop checkpoints at the next step boundary."""
        self._flags = SignalFlags().install([signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2])

    def signal_names(self) -> set:
        """Names of the signals received so far (e.g. {"SIGUSR2"})."""
        return set(self._flags.names()) if self._flags is not None else set()

    def heartbeat(self, step: int, *, force: bool = False) -> None:
        """Liveness signal: written whenever the step changes (the watchdog finds the laggard by
        step), otherwise at most once per interval. Call it at the top of each step."""
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
        _write_small(self.control_dir / HEARTBEAT_DIR / f"{self.rank}.json",
                     {"rank": self.rank, "host": socket.gethostname(), "step": step, "time": now,
                      "first_progress_t": self._first_progress_t, "attempt_id": self.attempt_id})

    def checkpoint_requested(self) -> bool:
        """This rank's view; use `agree()` so every rank acts at the same step."""
        if self._flags is not None and self._flags.any():
            return True
        return self.control_dir is not None and (self.control_dir / REQUEST_FILE).exists()

    def mark_stopped_for_requeue(self, step: int) -> None:
        if self.control_dir is not None and self.rank == 0:
            _write_small(self.control_dir / STOPPED_FILE, {"step": step, "attempt_id": self.attempt_id})

    def mark_complete(self, step: int) -> None:
        if self.control_dir is not None and self.rank == 0:
            _write_small(self.control_dir / COMPLETE_FILE, {"step": step, "attempt_id": self.attempt_id})


def agree(flag: bool) -> bool:
    """True on every rank if it is true on any rank (an all-reduce MAX); plain flag without torch.distributed."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return flag
    if not (dist.is_available() and dist.is_initialized()):
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())
