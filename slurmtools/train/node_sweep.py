"""What of this user's node memory may be swept: only directories provably no live job's.

Local rank 0 of every launch sweeps what ended jobs left in the node's memory (heartbeat
directories: node_beat; snapshots: snapshot_io). Age alone proves nothing: a job that hung past
10 minutes, waited in the queue after a requeue, or snapshots every 20 minutes leaves its
directories untouched that long and still needs them, and so may this user's other jobs on the
node. So a directory named for a Slurm job goes only when it is old *and* Slurm no longer lists
that job among this user's (one squeue, asked only when some directory is old); a local run's
(no job) by age alone; none when Slurm cannot be asked. Each sweep touches only names of its own
shape: the heartbeat sweep never sees `snapshots/`, the snapshot sweep only job keys.
"""
from __future__ import annotations

import math
import os
import re
import shutil
from pathlib import Path
from typing import Callable, Dict, FrozenSet, List, Mapping, Optional, Pattern, Tuple

from slurmtools.common.control_dir import LOCAL_JOB_ID
from slurmtools.errors import SlurmCommandError, UsageError
from slurmtools.slurm import commands as slurm

_HEX16 = "[0-9a-f]{16}"
# `<job>.<restart>[.<seq>]-<control digest>`: a launch's heartbeat directory (node_beat.node_dir)
ATTEMPT_DIR = re.compile(rf"^(?P<job>[0-9]{{1,12}}|{LOCAL_JOB_ID})(?:\.[0-9]{{1,9}})+-{_HEX16}$")
# `<job>-<control digest>`: a job's snapshot directory (snapshot.job_key)
JOB_KEY_DIR = re.compile(rf"^(?P<job>[0-9]{{1,12}}|{LOCAL_JOB_ID})-{_HEX16}$")

LiveJobs = Callable[[], Optional[FrozenSet[int]]]     # this user's jobs Slurm lists; None: cannot say
# how long a directory of node memory stays untouched before a sweep asks Slurm about its job (the
# sweeps' own defaults otherwise): a site or a rehearsal sets it shorter, the rule stays the same
SWEEP_AFTER_ENV = "SLURMTOOLS_NODE_SWEEP_AFTER_S"


def stale_after_s(environ: Mapping[str, str], default_s: float) -> float:
    """SWEEP_AFTER_ENV's seconds, default_s when it is unset; anything but a finite number of
    seconds above 0 is a UsageError naming the variable (a typo never silently keeps the default)."""
    text = environ.get(SWEEP_AFTER_ENV, "").strip()
    if not text:
        return default_s
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:        # NaN fails too
        raise UsageError(f"{SWEEP_AFTER_ENV}={text[:40]!r}: expected a number of seconds above 0")
    return value


def job_of(name: str, shape: Pattern[str]) -> "Optional[str]":
    """The job a directory of this shape belongs to (digits, or LOCAL_JOB_ID); None: not ours to sweep."""
    match = shape.match(name)
    return match.group("job") if match else None


def _old(newest_write_s: Dict[str, float], shape: Pattern[str], keep: str, now_s: float,
         stale_after_s: float) -> List[Tuple[str, str]]:
    """(name, job) of the directories of this shape, not keep, untouched for stale_after_s."""
    out = []
    for name, newest in sorted(newest_write_s.items()):
        job = job_of(name, shape)
        if job is not None and name != keep and now_s - newest > stale_after_s:
            out.append((name, job))
    return out


def removable(newest_write_s: Dict[str, float], shape: Pattern[str], keep: str, now_s: float,
              stale_after_s: float, live_jobs: Optional[FrozenSet[int]]) -> List[str]:
    """The names to remove: of this shape, not keep, untouched for stale_after_s, and either a
    local run's or a job Slurm no longer lists (live_jobs None: Slurm could not be asked, none)."""
    return [name for name, job in _old(newest_write_s, shape, keep, now_s, stale_after_s)
            if job == LOCAL_JOB_ID or (live_jobs is not None and int(job) not in live_jobs)]


def needs_slurm(newest_write_s: Dict[str, float], shape: Pattern[str], keep: str, now_s: float,
                stale_after_s: float) -> bool:
    """Whether some old directory belongs to a Slurm job: only then is Slurm asked."""
    return any(job != LOCAL_JOB_ID for _, job in _old(newest_write_s, shape, keep, now_s, stale_after_s))


def newest_writes(parent: Path, shape: Pattern[str]) -> Dict[str, float]:
    """name -> the newest mtime of the directory, its entries and theirs, for parent's
    directories of this shape (not links; one that vanishes or cannot be read is left out)."""
    out: Dict[str, float] = {}
    try:
        entries = [entry for entry in os.scandir(parent)
                   if entry.is_dir(follow_symlinks=False) and shape.match(entry.name)]
    except OSError:
        return out
    for entry in entries:
        path = Path(entry.path)
        try:
            out[entry.name] = max([path.stat().st_mtime] + [p.stat().st_mtime for p in path.glob("*/*")]
                                  + [p.stat().st_mtime for p in path.glob("*")])
        except OSError:
            continue
    return out


def sweep(parent: Path, shape: Pattern[str], keep: str, now_s: float, stale_after_s: float,
          live_jobs: Optional[LiveJobs] = None) -> List[str]:
    """Remove parent's directories that removable() names; returns their names. live_jobs:
    default this_users_live_jobs (squeue)."""
    writes = newest_writes(parent, shape)
    live = (live_jobs or this_users_live_jobs)() if needs_slurm(writes, shape, keep, now_s, stale_after_s) else frozenset()
    gone = removable(writes, shape, keep, now_s, stale_after_s, live)
    for name in gone:
        shutil.rmtree(parent / name, ignore_errors=True)
    return gone


def this_users_live_jobs() -> Optional[FrozenSet[int]]:
    """This user's jobs as Slurm lists them now; None when Slurm cannot be asked (not installed,
    the controller down): then no directory of a Slurm job is swept."""
    try:
        return slurm.user_job_ids(os.geteuid())
    except SlurmCommandError:
        return None
