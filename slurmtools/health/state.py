"""Node-local health state: last counter readings (for deltas), kernel-log watermark, the last
clean run (for the prolog cache and auto-resume), and per-job baselines (prolog -> epilog)."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

from slurmtools.fsutil import write_json_atomic

BASELINE_MAX_AGE_S = 7 * 24 * 3600


@dataclass
class HealthState:
    ib_counters: Dict[str, Dict[str, int]] = field(default_factory=dict)
    nvlink_counters: Dict[str, int] = field(default_factory=dict)
    kmsg_seq: int = -1
    last_clean_t: float = 0.0
    clean_runs: int = 0
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


def load(path: Path) -> HealthState:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return HealthState()
    loaded = HealthState()
    for key in ("ib_counters", "nvlink_counters", "kmsg_seq", "last_clean_t", "clean_runs", "jobs"):
        if key in data:
            setattr(loaded, key, data[key])
    return loaded


def save(path: Path, state: HealthState) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"ib_counters": state.ib_counters, "nvlink_counters": state.nvlink_counters,
                             "kmsg_seq": state.kmsg_seq, "last_clean_t": state.last_clean_t,
                             "clean_runs": state.clean_runs, "jobs": state.jobs, "saved_t": time.time()})
