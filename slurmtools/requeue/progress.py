"""Progress of a program that does not report it to slurmtools (no TrainingControl): inferred
from its own checkpoints appearing, or from its output lines, as the job spec says
(requeue.progress_checkpoints, progress_checkpoint_marker, progress_log_pattern).

A checkpoint counts once it is complete by the program's own convention: a name the glob
matches only after the program's rename (torch.save to `step_12.pt.tmp`, then os.replace to
`step_12.pt`), or, for a directory, the marker file the program writes last (`.metadata` for
torch.distributed.checkpoint). Its step is the last number in its name.
"""
from __future__ import annotations

import glob
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional

import regex

from slurmtools.common.control_dir import REPORTS_PROGRESS_FILE
from slurmtools.requeue import watchdog
from slurmtools.requeue.step import marker

_LAST_NUMBER = re.compile(r"(\d+)(?!.*\d)")


def step_in_name(path: str) -> Optional[int]:
    """The last number in a checkpoint's name (`ckpt-step00120.pt` -> 120), or None."""
    match = _LAST_NUMBER.search(os.path.basename(path.rstrip("/")))
    return int(match.group(1)) if match else None


def complete_checkpoints(pattern: str, marker_file: Optional[str]) -> Dict[str, Optional[int]]:
    """Every complete checkpoint the glob matches now, with its step: a directory only with its
    marker file in it, a file (or a directory without a marker configured) as soon as it exists."""
    found: Dict[str, Optional[int]] = {}
    for path in glob.glob(pattern, recursive=True):      # `ck/**/step_*.pt` reaches every depth
        if marker_file and os.path.isdir(path) and not os.path.isfile(os.path.join(path, marker_file)):
            continue
        found[path] = step_in_name(path)
    return found


def newest_step(checkpoints: Dict[str, Optional[int]]) -> Optional[int]:
    steps = [step for step in checkpoints.values() if step is not None]
    return max(steps) if steps else None


# a user's pattern meets every output line in the pump threads: only the line's start is matched,
# within a time bound (a pattern like `^(a+)+$` backtracks for ever on some lines, holding the GIL
# and freezing the supervisor: SIGTERM ignored), and a step number of more digits is no step
MAX_MATCHED_CHARS = 4096
MATCH_TIMEOUT_S = 0.05
MAX_STEP_DIGITS = 15


def log_step(pattern: Any, line: str) -> "tuple[bool, Optional[int]]":
    """(the line says a step was done, its number when the pattern's group 1 captures one); a
    match that runs past MATCH_TIMEOUT_S is no match."""
    try:
        match = pattern.search(line[:MAX_MATCHED_CHARS], timeout=MATCH_TIMEOUT_S)
    except TimeoutError:
        return False, None
    if not match:
        return False, None
    group = match.group(1) if pattern.groups >= 1 else None
    if group is not None and group.isdigit() and len(group) <= MAX_STEP_DIGITS:
        return True, int(group)
    return True, None


class LogProgress:
    """Fed every output line of the step (from the pump threads): when a step was last done,
    and its number."""

    def __init__(self, pattern: str) -> None:
        self.pattern = regex.compile(pattern)
        self.lock = threading.Lock()
        self.matches = 0
        self.last_step: Optional[int] = None
        self.last_t: Optional[float] = None

    def feed(self, line: str) -> None:
        done, step = log_step(self.pattern, line)
        if not done:
            return
        with self.lock:
            self.matches += 1
            self.last_t = time.time()
            if step is not None:
                self.last_step = step


@dataclass
class ProgressWatch:
    """One attempt of a program that does not report progress: the checkpoints there at its
    launch, and its log progress while it runs."""

    checkpoint_glob: Optional[str] = None
    checkpoint_marker: Optional[str] = None
    log: Optional[LogProgress] = None
    at_launch: Optional[Dict[str, Optional[int]]] = None

    @classmethod
    def start(cls, checkpoint_glob: Optional[str], checkpoint_marker: Optional[str], log_pattern: Optional[str],
              cwd: Optional[Path] = None) -> "ProgressWatch":
        pattern = checkpoint_glob
        if pattern and cwd is not None and not os.path.isabs(pattern):
            pattern = str(cwd / pattern)
        watch = cls(pattern, checkpoint_marker, LogProgress(log_pattern) if log_pattern else None)
        watch.at_launch = complete_checkpoints(pattern, checkpoint_marker) if pattern else None
        return watch

    def checkpoints(self) -> Optional[Dict[str, Optional[int]]]:
        return complete_checkpoints(self.checkpoint_glob, self.checkpoint_marker) if self.checkpoint_glob else None

    def new_checkpoints(self) -> Dict[str, Optional[int]]:
        """Complete checkpoints that were not there at the launch."""
        now = self.checkpoints() or {}
        return {path: step for path, step in now.items() if path not in (self.at_launch or {})}

    def progressed(self) -> bool:
        return bool(self.new_checkpoints()) or bool(self.log is not None and self.log.matches)

    def last_step(self) -> Optional[int]:
        steps = [step for step in (newest_step(self.new_checkpoints()),
                                   self.log.last_step if self.log is not None else None) if step is not None]
        return max(steps) if steps else None

    def newest_checkpoint_step(self) -> Optional[int]:
        found = self.checkpoints()
        return newest_step(found) if found is not None else None

    def stall(self, reports: bool, start_t: float, now: float, timeout_s: int, allowance_s: float
              ) -> Optional[watchdog.Stall]:
        """No heartbeat yet. A program that reports progress hangs when still silent after the
        start-up allowance plus timeout_s; one that does not, when its progress lines (the spec's
        pattern) stop for timeout_s (the first is allowed the start-up allowance). Without a
        pattern such a program is never judged hung: silence is all it ever shows."""
        if reports:
            idle_s = now - start_t
            return watchdog.Stall(idle_s, None, None, 0) if idle_s > timeout_s + allowance_s else None
        if self.log is None:
            return None
        with self.log.lock:
            last_t, last_step = self.log.last_t, self.log.last_step
        idle_s = now - (last_t if last_t is not None else start_t + allowance_s)
        if idle_s <= timeout_s:
            return None
        return watchdog.Stall(idle_s, None, None, last_step or 0,
                              f"no progress line from the program for {idle_s:.0f} s")


def reports_progress(control_dir: Path, beats_seen: bool) -> bool:
    """The program uses TrainingControl: its marker (made before the first step) or a heartbeat."""
    return beats_seen or marker(control_dir / REPORTS_PROGRESS_FILE)
