"""Node-local health state: last counter readings (for deltas), kernel-log watermark, the last
clean run (for the prolog cache and auto-resume), and per-job baselines (prolog -> epilog)."""
from __future__ import annotations

import json
import math
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from slurmtools.common.fsutil import write_json_atomic
from slurmtools.errors import ConfigError

BASELINE_MAX_AGE_S = 7 * 24 * 3600
MAX_STATE_BYTES = 8 << 20


@dataclass
class HealthState:
    ib_counters: Dict[str, Dict[str, int]] = field(default_factory=dict)
    nvlink_counters: Dict[str, int] = field(default_factory=dict)
    ib_t: float = 0.0                   # when ib_counters were read (rates per hour)
    ib_init_since: Dict[str, float] = field(default_factory=dict)   # port -> first seen in INIT
    kmsg_seq: int = -1
    last_clean_t: float = 0.0
    clean_runs: int = 0
    reboot_times: List[float] = field(default_factory=list)   # reboots we requested (remedy.py's bound)
    jobs: Dict[str, Dict[str, Any]] = field(default_factory=dict)

    def baseline_for(self, job_id: Optional[str]) -> Optional[Dict[str, Any]]:
        return self.jobs.get(job_id) if job_id else None

    def record_baseline(self, job_id: str, now_s: float) -> None:
        self.jobs[job_id] = {"t": now_s, "ib_counters": self.ib_counters, "nvlink_counters": self.nvlink_counters,
                             "kmsg_seq": self.kmsg_seq}
        self.jobs = {k: v for k, v in self.jobs.items() if now_s - float(v.get("t", 0)) < BASELINE_MAX_AGE_S}


def state_file(state_dir: Path, host: str) -> Path:
    """Per host, so nodes that share a filesystem (the mini-cluster) never share state."""
    return state_dir / host / "state.json"


def _counts(value: Any) -> bool:
    return isinstance(value, dict) and len(value) <= 10000 and all(
        isinstance(key, str) and isinstance(count, int) and not isinstance(count, bool) for key, count in value.items())


def _ib(value: Any) -> bool:
    return isinstance(value, dict) and len(value) <= 1024 and all(
        isinstance(key, str) and _counts(counters) for key, counters in value.items())


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _small_int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < high


def _baseline(value: Any) -> bool:
    return (isinstance(value, dict) and _number(value.get("t")) and _ib(value.get("ib_counters"))
            and _counts(value.get("nvlink_counters")) and _small_int(value.get("kmsg_seq"), -1, 1 << 62))


def problem_of(data: Any) -> Optional[str]:
    """Why a state document cannot be trusted (wrong types, impossible values), or None."""
    if not isinstance(data, dict):
        return "not a JSON object"
    checks: Dict[str, Callable[[Any], bool]] = {
        "ib_counters": _ib, "nvlink_counters": _counts,
        "kmsg_seq": lambda value: _small_int(value, -1, 1 << 62),
        "ib_t": lambda value: _number(value) and value >= 0,
        "ib_init_since": lambda value: isinstance(value, dict) and len(value) <= 1024 and all(
            isinstance(key, str) and _number(t) for key, t in value.items()),
        "last_clean_t": lambda value: _number(value) and value >= 0,
        "clean_runs": lambda value: _small_int(value, 0, 1 << 31),
        "reboot_times": lambda value: isinstance(value, list) and len(value) <= 1000 and all(
            _number(t) for t in value),
        "jobs": lambda value: isinstance(value, dict) and len(value) <= 10000 and all(
            isinstance(key, str) and _baseline(baseline) for key, baseline in value.items())}
    for key, valid in checks.items():
        if key in data and not valid(data[key]):
            return f"{key} has the wrong type or an impossible value"
    return None


def load(path: Path) -> Tuple[HealthState, Optional[str]]:
    """The node's state, and why it was discarded when it was (a bad file is treated as absent)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return HealthState(), None
    except OSError as exc:
        return HealthState(), f"cannot read {path.name}: {exc.strerror}"
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return HealthState(), f"{path.name} is not a regular file"
        raw = handle.read(MAX_STATE_BYTES + 1)
    if len(raw) > MAX_STATE_BYTES:
        return HealthState(), f"{path.name} is larger than {MAX_STATE_BYTES} bytes"
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return HealthState(), f"{path.name} is not valid JSON"
    problem = problem_of(data)
    if problem:
        return HealthState(), problem
    loaded = HealthState()
    for key in ("ib_counters", "ib_t", "ib_init_since", "nvlink_counters", "kmsg_seq", "last_clean_t", "clean_runs",
                "reboot_times", "jobs"):
        if key in data:
            setattr(loaded, key, data[key])
    return loaded, None


def check_state_dir(state_dir: Path) -> None:
    """As root the state decides what the next prolog compares with: a directory another user
    can write (or a link in its place) is refused, before anything is read from or written to it."""
    if os.geteuid() != 0:
        return
    for directory in (state_dir, state_dir.parent):
        try:
            info = os.lstat(directory)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(info.st_mode) and directory == state_dir:
            raise ConfigError(f"state_dir {state_dir}: refused: a symbolic link")
        if info.st_uid != 0 or info.st_mode & 0o022:
            raise ConfigError(f"state_dir {state_dir}: refused: {directory} is not root-owned or is "
                              f"group/world writable (mode {oct(info.st_mode & 0o777)}, uid {info.st_uid})")


def save(path: Path, state: HealthState) -> None:
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    write_json_atomic(path, {"ib_counters": state.ib_counters, "ib_t": state.ib_t,
                             "ib_init_since": state.ib_init_since, "nvlink_counters": state.nvlink_counters,
                             "kmsg_seq": state.kmsg_seq, "last_clean_t": state.last_clean_t,
                             "clean_runs": state.clean_runs, "reboot_times": state.reboot_times, "jobs": state.jobs, "saved_t": time.time()})
