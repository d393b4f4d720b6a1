"""The per-job ledger: one JSON line per attempt start and end, kept in the control directory.

It is the supervisor's memory across requeues (failure budget, no-progress guard) and the
input of `slurmtools goodput`. Reading and the goodput arithmetic are pure.
"""
from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from slurmtools.requeue.policy import AttemptRecord, Cause

LEDGER_FILE = "ledger.jsonl"


def append(control_dir: Path, record: Dict[str, Any]) -> None:
    """Append one line with O_APPEND + fsync: a killed writer leaves whole lines or nothing useful."""
    control_dir.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(control_dir / LEDGER_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def read(path: Path) -> List[Dict[str, Any]]:
    """Records from a ledger file (or a control dir); a torn last line is ignored."""
    if path.is_dir():
        path = path / LEDGER_FILE
    out = []
    try:
        text = path.read_text()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


@dataclass(frozen=True)
class Attempt:
    attempt_id: str
    start_s: float
    end_s: Optional[float]
    resume_step: Optional[int]
    first_step_s: Optional[float]
    last_step: Optional[int]
    checkpoint_step: Optional[int]
    cause: Optional[str]
    action: Optional[str]
    counted: bool
    node: Optional[str]


def attempts(records: List[Dict[str, Any]]) -> List[Attempt]:
    starts: Dict[str, Dict[str, Any]] = {}
    order: List[str] = []
    ends: Dict[str, Dict[str, Any]] = {}
    for r in records:
        aid = str(r.get("attempt_id"))
        if r.get("event") == "start":
            if aid not in starts:
                order.append(aid)
            starts[aid] = r
        elif r.get("event") == "end":
            ends[aid] = r
    out = []
    for aid in order:
        s, e = starts[aid], ends.get(aid, {})
        out.append(Attempt(aid, float(s["t"]), e.get("t"), s.get("resume_step"), e.get("first_step_t"),
                           e.get("last_step"), e.get("checkpoint_step"), e.get("cause"), e.get("action"),
                           bool(e.get("counted", False)), e.get("node")))
    return out


def history(records: List[Dict[str, Any]]) -> List[AttemptRecord]:
    """Finished attempts as the policy sees them (oldest first)."""
    return [AttemptRecord(Cause(a.cause), a.counted, a.checkpoint_step, a.node)
            for a in attempts(records) if a.cause in {c.value for c in Cause}]


@dataclass(frozen=True)
class Goodput:
    wall_s: float
    productive_s: float
    final_step: int
    step_time_s: Optional[float]
    attempts: int
    failures: int
    preemptions: int
    steps_lost: List[int]
    restart_latency_s: List[float]     # end of an attempt -> start of the next
    time_to_first_step_s: List[float]  # start of an attempt -> its first finished step

    @property
    def ratio(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0


def goodput(records: List[Dict[str, Any]]) -> Goodput:
    """Effective training time ratio: (final step x median step time) / wall time of the whole chain."""
    atts = attempts(records)
    if not atts:
        return Goodput(0.0, 0.0, 0, None, 0, 0, 0, [], [], [])
    wall_end = max((a.end_s for a in atts if a.end_s is not None), default=atts[-1].start_s)
    wall = wall_end - atts[0].start_s
    rates = []
    for a in atts:
        done = (a.last_step or 0) - (a.resume_step or 0)
        if a.first_step_s is not None and a.end_s is not None and done > 1:
            rates.append((a.end_s - a.first_step_s) / (done - 1))
    step_time = statistics.median(rates) if rates else None
    final = max((a.checkpoint_step or 0 for a in atts), default=0)
    final = max(final, max((a.last_step or 0 for a in atts if a.cause == Cause.COMPLETED.value), default=0))
    lost = [max(0, (a.last_step or 0) - (a.checkpoint_step or 0)) for a in atts
            if a.cause not in (None, Cause.COMPLETED.value)]
    latency = [b.start_s - a.end_s for a, b in zip(atts, atts[1:]) if a.end_s is not None]
    first = [a.first_step_s - a.start_s for a in atts if a.first_step_s is not None]
    return Goodput(wall, final * step_time if step_time else 0.0, final, step_time, len(atts),
                   sum(1 for a in atts if a.counted), sum(1 for a in atts if a.cause == Cause.PREEMPTED.value),
                   lost, latency, first)


def format_goodput(g: Goodput) -> str:
    def fmt(xs: List[float]) -> str:
        return ", ".join(f"{x:.1f}" for x in xs) or "-"
    lines = [
        f"attempts: {g.attempts} (failures {g.failures}, preemptions {g.preemptions})",
        f"final step: {g.final_step}",
        f"wall time: {g.wall_s:.1f} s",
        f"step time (median): {g.step_time_s:.3f} s" if g.step_time_s else "step time: unknown",
        f"effective training time ratio: {g.ratio:.1%}",
        f"steps lost per failure/preemption: {', '.join(map(str, g.steps_lost)) or '-'}",
        f"restart latency (end -> next start): {fmt(g.restart_latency_s)} s",
        f"start -> first step: {fmt(g.time_to_first_step_s)} s",
    ]
    return "\n".join(lines)
