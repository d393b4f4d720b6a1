"""Goodput from the ledger (pure arithmetic): the effective training time ratio, restart
latencies, time to the first step, the steps lost, the input of `slurmtools goodput`, the job
report and the metrics."""
from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from slurmtools.common.fsutil import json_safe
from slurmtools.common.ledger import Attempt, Cause, Event, attempts

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
    restart_latency_s: List[float]     # an attempt's last finished step -> the next one's first step
    time_to_first_step_s: List[float]  # start of an attempt -> its first finished step
    step_time_source: str = "heartbeats"

    @property
    def ratio(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    def to_json(self) -> Dict[str, Any]:
        """Valid JSON: a value that is not a finite number becomes null."""
        safe: Dict[str, Any] = json_safe({"ratio": self.ratio, **dataclasses.asdict(self)})
        return safe


def heartbeat_step_time_s(atts: List[Attempt]) -> Optional[float]:
    """The step time from the ledger alone: per attempt, its first to its last finished step over
    the steps between (older ledgers without the last step's time: to the attempt's end), median."""
    rates = []
    for attempt in atts:
        done = (attempt.last_step or 0) - (attempt.resume_step or 0)
        last_t = attempt.last_step_s if attempt.last_step_s is not None else attempt.end_s
        if attempt.first_step_s is not None and last_t is not None and done > 1:
            rates.append(max(0.0, last_t - attempt.first_step_s) / (done - 1))
    return statistics.median(rates) if rates else None


def restart_latencies_s(atts: List[Attempt]) -> List[float]:
    """Per restart, what it cost: from the failed (or preempted) attempt's last finished step --
    the failure's detection, the wait for a node or the queue, the launch and the checkpoint load
    follow it -- to the next attempt's first finished step. Without those times (an attempt that
    never stepped), its end and the next one's start."""
    out = []
    for earlier, later in zip(atts, atts[1:]):
        if earlier.end_s is None:
            continue
        since = earlier.last_step_s if earlier.last_step_s is not None else earlier.end_s
        until = later.first_step_s if later.first_step_s is not None else later.start_s
        out.append(max(0.0, until - since))
    return out


def goodput(events: List[Event], step_time_s: Optional[float] = None) -> Goodput:
    """Effective training time ratio: (final step x median step time) / wall time of the whole chain.

    step_time_s: the step time measured by the trainer (the step log's, jobreport.job_step_time_s);
    without it, the ledger's estimate from heartbeats (heartbeat_step_time_s)."""
    atts = attempts(events)
    if not atts:
        return Goodput(0.0, 0.0, 0, None, 0, 0, 0, [], [], [])
    wall_end = max((a.end_s for a in atts if a.end_s is not None), default=atts[-1].start_s)
    wall = max(0.0, wall_end - atts[0].start_s)
    source = "step log" if step_time_s is not None else "heartbeats"
    step_time = step_time_s if step_time_s is not None else heartbeat_step_time_s(atts)
    final = max((a.checkpoint_step or 0 for a in atts), default=0)
    final = max(final, max((a.last_step or 0 for a in atts if a.cause == Cause.COMPLETED.value), default=0))
    lost = [max(0, (a.last_step or 0) - (a.checkpoint_step or 0)) for a in atts
            if a.cause not in (None, Cause.COMPLETED.value)]
    first = [max(0.0, a.first_step_s - a.start_s) for a in atts if a.first_step_s is not None]
    return Goodput(wall, final * step_time if step_time else 0.0, final, step_time, len(atts),
                   sum(1 for attempt in atts if attempt.counted), sum(1 for attempt in atts if attempt.cause == Cause.PREEMPTED.value),
                   lost, restart_latencies_s(atts), first, source)


# How each source measures a step: the trainer's own duration of each step (its slowest rank),
# or, from the ledger alone, the time between the first and the last finished step of an attempt.
STEP_TIME_MEANING = {"step log": "slowest rank's step", "heartbeats": "first to last step / steps"}


def format_goodput(result: Goodput) -> str:
    def fmt(values: List[float]) -> str:
        return ", ".join(f"{value:.1f}" for value in values) or "-"
    lines = [
        f"attempts: {result.attempts} (failures {result.failures}, preemptions {result.preemptions})",
        f"final step: {result.final_step}",
        f"wall time: {result.wall_s:.1f} s",
        (f"step time (median, {STEP_TIME_MEANING[result.step_time_source]}): {result.step_time_s:.3f} s"
         if result.step_time_s else "step time: unknown"),
        f"effective training time ratio: {result.ratio:.1%}",
        f"steps lost per failure/preemption: {', '.join(map(str, result.steps_lost)) or '-'}",
        f"restart latency (last step -> next first step): {fmt(result.restart_latency_s)} s",
        f"start -> first step: {fmt(result.time_to_first_step_s)} s",
    ]
    return "\n".join(lines)
