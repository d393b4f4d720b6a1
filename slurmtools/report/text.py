"""What `slurmtools report` shows about one job chain, computed (pure) from its ledger and its
step log: the attempts on a timeline with their end (cause, node, action), checkpoints, drains
and straggler verdicts; loss and tokens/s per step across attempts; step time per node; and the
wall time broken down into training, checkpointing, restarts, lost steps and waiting.
The text form is here too; the HTML page with the plots is report_html.py."""
from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from slurmtools.common import ledger
from slurmtools.common.fsutil import json_safe
from slurmtools.common.ledger import Event
from slurmtools.errors import one_line
from slurmtools.requeue import goodput
from slurmtools.requeue.goodput import Goodput
from slurmtools.train import steplog
from slurmtools.train.steplog import StepHistory, StepRecord

Series = List[Tuple[int, float]]          # (step, value)


@dataclass(frozen=True)
class Mark:
    """A point on the timeline: a checkpoint, a drain, a straggler, a preflight verdict."""
    time_s: float
    kind: str
    label: str


@dataclass(frozen=True)
class Breakdown:
    """Where the chain's wall time went, in seconds (they add up to wall_s)."""
    wall_s: float
    training_s: float        # the steps that count (final step x median step time)
    checkpointing_s: float   # training waiting for checkpoint saves
    restarts_s: float        # a failed attempt's end to the next one's first step (queue, launch, load)
    lost_s: float            # steps redone after failures and preemptions
    waiting_s: float         # the rest: the first start-up, stalls, collective waits beyond the median

    def parts(self) -> List[Tuple[str, float]]:
        return [("training", self.training_s), ("checkpointing", self.checkpointing_s),
                ("restarts", self.restarts_s), ("lost steps", self.lost_s), ("waiting", self.waiting_s)]


@dataclass(frozen=True)
class JobReport:
    job: str
    attempts: List[ledger.Attempt]
    goodput: Goodput
    breakdown: Breakdown
    marks: List[Mark]
    loss: Dict[str, Series]                  # attempt id -> rank 0's loss per step
    tokens_per_s: Dict[str, Series]          # attempt id -> the job's tokens/s per step (all ranks)
    step_s_by_node: Dict[str, Series]        # node -> its slowest rank's step time per step (all attempts)
    start_s: float
    slowest_rank_by_node: Dict[str, int] = field(default_factory=dict)   # node -> its rank most often slowest


def _series_by_attempt(steps: Sequence[StepRecord]) -> Tuple[Dict[str, Series], Dict[str, Series]]:
    loss: Dict[str, Series] = defaultdict(list)
    tokens: Dict[Tuple[str, int], float] = defaultdict(float)
    for record in steps:
        if record.rank == 0 and record.loss is not None:
            loss[record.attempt_id].append((record.step, record.loss))
        if record.tokens is not None and record.step_s > 0:
            tokens[(record.attempt_id, record.step)] += record.tokens / record.step_s
    rate: Dict[str, Series] = defaultdict(list)
    for (attempt_id, step), value in sorted(tokens.items(), key=lambda item: (item[0][0], item[0][1])):
        rate[attempt_id].append((step, value))
    return {key: sorted(value) for key, value in loss.items()}, dict(rate)


def _step_time_by_node(steps: Sequence[StepRecord]) -> Tuple[Dict[str, Series], Dict[str, int]]:
    """Per node, per step, its slowest rank's time (several attempts may repeat a step: the later
    wins); and per node the rank that was its slowest most often (a node's records name theirs)."""
    per: Dict[str, Dict[int, Tuple[float, int]]] = defaultdict(dict)
    latest: Dict[Tuple[str, int], str] = {}
    for record in steps:                        # time order
        key = (record.host, record.step)
        if latest.get(key) not in (None, record.attempt_id):
            per[record.host].pop(record.step, None)
        latest[key] = record.attempt_id
        rank = record.slowest_rank if record.slowest_rank is not None else record.rank
        per[record.host][record.step] = max(per[record.host].get(record.step, (-1.0, 0)), (record.step_s, -rank))
    times = {host: sorted((step, value[0]) for step, value in values.items()) for host, values in sorted(per.items())}
    slowest = {host: Counter(-value[1] for value in values.values()).most_common() for host, values in per.items()}
    return times, {host: min(rank for rank, count in ranks if count == ranks[0][1]) for host, ranks in slowest.items()}


def _marks(events: Sequence[Event], history: StepHistory) -> List[Mark]:
    marks = [Mark(c.time_s, "checkpoint", f"checkpoint step {c.step} ({c.save_s:.1f} s)")
             for c in history.checkpoints]
    for event in events:
        if isinstance(event, ledger.AttemptEnd) and event.cause != "completed":
            on = f" on {event.node}" if event.node else ""
            marks.append(Mark(event.time_s, "failure", f"{event.cause}{on} -> {event.action or 'stop'}"))
        elif isinstance(event, ledger.NodeSlowdown) and event.straggler:
            marks.append(Mark(event.time_s, "straggler", f"straggler {event.straggler} ({event.action or 'report'})"))
        elif isinstance(event, ledger.PreflightCheck) and event.status != "passed":
            named = ", ".join(sorted(event.named)) or "-"
            marks.append(Mark(event.time_s, "preflight", f"preflight {event.status}: {named}"))
        elif isinstance(event, ledger.CheckpointRefused):
            marks.append(Mark(event.time_s, "refused", f"checkpoint {Path(event.path).name} refused: {event.why}"))
        elif isinstance(event, ledger.SnapshotRestore):
            marks.append(Mark(event.time_s, "snapshot", f"resumed from the in-memory {event.why}" if event.step is not None
                              else f"snapshots not used: {event.why}"))
    return sorted(marks, key=lambda mark: mark.time_s)


def breakdown(result: Goodput, attempts: Sequence[ledger.Attempt], history: StepHistory) -> Breakdown:
    step_s = result.step_time_s or 0.0
    training = min(result.productive_s, result.wall_s)
    checkpointing = sum(c.save_s for c in history.checkpoints)
    restarts = sum(result.restart_latency_s)     # each: last step -> the next attempt's first step
    lost = sum(result.steps_lost) * step_s
    overheads = checkpointing + restarts + lost
    room = max(0.0, result.wall_s - training)
    if overheads > room:         # estimates past the wall time: the overheads share what is left of it
        scale = room / overheads
        checkpointing, restarts, lost = checkpointing * scale, restarts * scale, lost * scale
    waiting = max(0.0, result.wall_s - training - checkpointing - restarts - lost)
    return Breakdown(result.wall_s, training, checkpointing, restarts, lost, waiting)


def job_step_time_s(history: StepHistory) -> Optional[float]:
    """The report's one step time: per step, its slowest rank's own duration of it (a redone step
    counts once, as its later attempt did it), median over the steps. The per-node plot shows the
    same numbers per node."""
    slowest: Dict[int, float] = {}
    latest: Dict[int, str] = {}
    for record in history.steps:                # time order
        if latest.get(record.step) not in (None, record.attempt_id):
            slowest.pop(record.step, None)
        latest[record.step] = record.attempt_id
        slowest[record.step] = max(slowest.get(record.step, 0.0), record.step_s)
    return statistics.median(slowest.values()) if slowest else None


def build(job: str, events: Sequence[Event], history: StepHistory) -> JobReport:
    attempts = ledger.attempts(list(events))
    result = goodput.goodput(list(events), job_step_time_s(history))
    loss, rate = _series_by_attempt(history.steps)
    starts = [a.start_s for a in attempts] + [s.time_s - s.step_s for s in history.steps[:1]]
    by_node, slowest = _step_time_by_node(history.steps)
    return JobReport(job, attempts, result, breakdown(result, attempts, history), _marks(events, history), loss,
                     rate, by_node, min(starts, default=0.0), slowest)


def load(target: Path) -> Optional[JobReport]:
    """The report of the job whose control dir (or ledger file) is target; None without a ledger."""
    control_dir = target if target.is_dir() else target.parent
    events = ledger.read(target)
    if not events:
        return None
    return build(control_dir.name, events, steplog.read(control_dir))


def to_json(report: JobReport) -> Dict[str, Any]:
    """The report as `report --json` prints it: every field, the goodput with its ratio, times in
    epoch seconds, series as [step, value] pairs; a value that is not a finite number is null."""
    fields = {name: getattr(report, name) for name in ("job", "start_s", "loss", "tokens_per_s", "step_s_by_node",
                                                        "slowest_rank_by_node")}
    safe: Dict[str, Any] = json_safe({**fields, "attempts": [asdict(attempt) for attempt in report.attempts],
                                      "goodput": report.goodput.to_json(), "breakdown": asdict(report.breakdown),
                                      "marks": [asdict(mark) for mark in report.marks]})
    return safe


def format_text(report: JobReport) -> str:
    """The terminal form: the goodput summary, one line per attempt, the breakdown, the marks."""
    lines = [f"job {report.job}", *goodput.format_goodput(report.goodput).splitlines(), "", "attempts:"]
    for attempt in report.attempts:
        begin = attempt.start_s - report.start_s
        end = "running" if attempt.end_s is None else f"+{attempt.end_s - report.start_s:.1f} s"
        outcome = attempt.cause or "-"
        if attempt.node:
            outcome += f" on {attempt.node}"
        if attempt.action:
            outcome += f" -> {attempt.action}"
        lines.append(f"  {attempt.attempt_id:<14} +{begin:.1f} s .. {end:<10} steps {attempt.resume_step or 0}"
                     f"..{attempt.last_step if attempt.last_step is not None else '?'}  {outcome}")
    parts = report.breakdown.parts()
    wall = report.breakdown.wall_s
    lines += ["", "wall time: " + ", ".join(f"{name} {value:.1f} s ({value / wall:.0%})" if wall > 0 else
                                           f"{name} {value:.1f} s" for name, value in parts)]
    if report.step_s_by_node:
        lines.append("median step time by node: " + ", ".join(
            f"{node} {statistics.median(v for _, v in series):.3f} s" + (
                f" (slowest rank {report.slowest_rank_by_node[node]})" if node in report.slowest_rank_by_node else "")
            for node, series in report.step_s_by_node.items()))
    if report.marks:
        lines += ["", "events:"] + [f"  +{m.time_s - report.start_s:.1f} s  {m.label}" for m in report.marks]
    # names come from files the job's processes wrote: a control character (an escape sequence, a
    # newline that forges a line) reaches the terminal escaped
    return "\n".join(one_line(line) for line in lines)
