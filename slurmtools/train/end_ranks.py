"""End this attempt's processes on this node: a hung node's ranks, for in-place recovery.

The supervisor found the step hung on a node (watchdog: the laggard's host) and recovers in place:
that node is drained and its ranks start again on a spare, while every other rank keeps its
process. The hung ranks are ended here, on the node itself, in a one-task step beside the
training step (`srun --overlap`): Slurm has no signal for one node's tasks of a step. Only
processes of this node, this user, this job and this attempt are touched (their environment says
SLURM_JOB_ID and SLURMTOOLS_ATTEMPT_ID, as the step gave them), never this step's own. Once they
are gone the node's heartbeat file is removed: the hung ranks' records would stand for the
spare's ranks (the same ranks).

    python -m slurmtools.train.end_ranks            (as the one task of a step on that node)
"""
from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path
from typing import List, Mapping, Optional, Sequence

import psutil

from slurmtools.common.control_dir import ATTEMPT_ID_ENV, CONTROL_DIR_ENV, HEARTBEAT_DIR
from slurmtools.train.node_beat import node_file_name

# how long the ended processes may take to be gone (SIGKILL: the kernel's time to reap them)
GONE_WAIT_S = 10.0


def of_this_attempt(environ: Mapping[str, str], job_id: str, attempt_id: str) -> bool:
    """A process's environment says this job and this attempt (pure: what is matched)."""
    return environ.get("SLURM_JOB_ID") == job_id and environ.get(ATTEMPT_ID_ENV) == attempt_id


def attempt_processes(job_id: str, attempt_id: str, spared: Sequence[int]) -> List[psutil.Process]:
    """This user's processes of the attempt on this node, less those in spared (this step's own).
    On this node: in this process's UTS namespace (the machine's own on a real node; the
    mini-cluster's nodes share one machine's process table, each its own hostname)."""
    uid, node = os.getuid(), _uts(os.getpid())
    found = []
    for process in psutil.process_iter(["uids"]):
        try:
            if process.pid in spared or process.info["uids"] is None or process.info["uids"].real != uid:
                continue
            if _uts(process.pid) == node and of_this_attempt(process.environ(), job_id, attempt_id):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def _uts(pid: int) -> str:
    """The process's UTS namespace (its hostname's), as the kernel names it."""
    return os.readlink(f"/proc/{pid}/ns/uts")


def own_line() -> List[int]:
    """This process and its ancestors (the step's wrapper, exec'd into this one, included)."""
    me = psutil.Process()
    return [me.pid, *(parent.pid for parent in me.parents())]


def end(environ: Mapping[str, str], host: Optional[str] = None) -> str:
    """End the attempt's processes here and remove the node's heartbeat file; what was done."""
    job_id, attempt_id, control = environ.get("SLURM_JOB_ID", ""), environ.get(ATTEMPT_ID_ENV, ""), environ.get(
        CONTROL_DIR_ENV, "")
    if not (job_id and attempt_id and control):
        raise SystemExit("slurmtools.train.end_ranks: run it as a step of the job: SLURM_JOB_ID, "
                         f"{ATTEMPT_ID_ENV} and {CONTROL_DIR_ENV} must be set")
    host = host or socket.gethostname()
    processes = attempt_processes(job_id, attempt_id, own_line())
    for process in processes:
        try:
            process.send_signal(signal.SIGKILL)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    _, alive = psutil.wait_procs(processes, timeout=GONE_WAIT_S)
    if alive:
        raise SystemExit(f"slurmtools.train.end_ranks: {len(alive)} process(es) of attempt {attempt_id} on {host} "
                         f"still run {GONE_WAIT_S:g} s after SIGKILL (pid {alive[0].pid})")
    (Path(control) / HEARTBEAT_DIR / node_file_name(host)).unlink(missing_ok=True)
    return f"ended {len(processes)} process(es) of attempt {attempt_id} on {host}"


def main() -> int:
    print(f"slurmtools: {end(os.environ)}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
