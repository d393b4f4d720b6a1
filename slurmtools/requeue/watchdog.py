"""Heartbeat watchdog: read every rank's heartbeat file and find a stall and its laggard.

A rank that hangs stops before announcing its next step, while the others announce it and
then block inside a collective: the laggard is the rank with the lowest step. Deciding on a
stall is pure (`judge`); reading the files is `read_heartbeats`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from slurmtools.runtime import HEARTBEAT_DIR


@dataclass(frozen=True)
class Beat:
    rank: int
    host: str
    step: int
    time_s: float
    first_progress_s: Optional[float] = None   # when this rank first completed a step this attempt


def first_progress(beats: List[Beat]) -> Optional[float]:
    """When the attempt's first step was done (the earliest rank), for goodput."""
    return min((b.first_progress_s for b in beats if b.first_progress_s is not None), default=None)


@dataclass(frozen=True)
class Stall:
    idle_s: float
    rank: Optional[int]     # the laggard, when exactly one rank is behind
    host: Optional[str]
    step: int


def read_heartbeats(control_dir: Path) -> List[Beat]:
    beats: List[Beat] = []
    heartbeat_dir = control_dir / HEARTBEAT_DIR
    if not heartbeat_dir.is_dir():
        return beats
    for path in heartbeat_dir.glob("*.json"):
        try:
            data = json.loads(path.read_text())
            first = data.get("first_progress_t")
            beats.append(Beat(int(data["rank"]), str(data.get("host", "")), int(data["step"]), float(data["time"]),
                              float(first) if first is not None else None))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a half-written or foreign file is no evidence
    return sorted(beats, key=lambda b: b.rank)


def judge(beats: List[Beat], now_s: float, timeout_s: float, expected_ranks: Optional[int] = None) -> Optional[Stall]:
    """A stall when no rank has beaten for timeout_s; the laggard when one rank is behind the rest."""
    if timeout_s <= 0 or not beats:
        return None
    newest = max(beat.time_s for beat in beats)
    idle = now_s - newest
    if idle < timeout_s:
        return None
    steps: Dict[int, List[Beat]] = {}
    for beat in beats:
        steps.setdefault(beat.step, []).append(beat)
    low = min(steps)
    laggards = steps[low]
    if len(steps) > 1 and len(laggards) == 1:
        lag = laggards[0]
        return Stall(idle, lag.rank, lag.host, lag.step)
    if expected_ranks is not None and len(beats) == expected_ranks - 1:
        # one rank never beat at all: it is the laggard, but its host is unknown
        missing = sorted(set(range(expected_ranks)) - {b.rank for b in beats})
        return Stall(idle, missing[0] if missing else None, None, low)
    return Stall(idle, None, None, low)
