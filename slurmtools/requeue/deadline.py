"""The job's own clock for the time-limit warning.

Slurm sends `--signal=SIG@lead_s` from slurmctld's periodic time-limit check (every 30 s) and
may send it up to 60 s early (sbatch(1), --signal). A warning that reaches the node while the
prolog still runs, or while the batch script still ignores the signal during its start-up, is
lost for good: Slurm marks it sent either way. Seen on Slurm 22.05 (CI, 2 cores) with --time=1
and a 30 s lead: one attempt among several got no warning, ran into its time limit and ended
TIMEOUT instead of checkpointing and requeueing. So whoever waits for the warning also keeps
the clock: when the time left falls to the lead and no warning came, it acts as warned.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

from slurmtools.errors import SlurmCommandError

RECHECK_S = 10.0        # when due, ask Slurm again at most this often (an admin may raise the limit)


def warning_due(end_s: Optional[float], now_s: float, lead_s: float) -> bool:
    """The time left is inside the warning lead (never, without a time limit)."""
    return end_s is not None and end_s - now_s <= lead_s


class WarningClock:
    """The job's end time, read from Slurm when an attempt starts and again before it says "due"."""

    def __init__(self, job_id: Optional[int], lead_s: float,
                 read_end: Optional[Callable[[int], Optional[float]]] = None) -> None:
        if read_end is None:
            from slurmtools.slurm.commands import job_end_time
            read_end = job_end_time
        self.job_id = job_id
        self.lead_s = lead_s
        self._read_end = read_end
        self._read_at_s = 0.0
        self.end_s: Optional[float] = None
        self._read(time.time())

    def _read(self, now_s: float) -> None:
        self._read_at_s = now_s
        if self.job_id is None:
            return
        try:
            self.end_s = self._read_end(self.job_id)
        except SlurmCommandError:
            pass          # keep what we knew: a busy slurmctld is no reason to warn or not

    def due(self, now_s: float) -> bool:
        """True once the time left is inside the lead, by the end time Slurm says now."""
        if not warning_due(self.end_s, now_s, self.lead_s):
            return False
        if now_s - self._read_at_s >= RECHECK_S:
            self._read(now_s)
        return warning_due(self.end_s, now_s, self.lead_s)
