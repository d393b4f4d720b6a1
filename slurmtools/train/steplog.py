"""Each rank's finished steps (and rank 0's checkpoints) as JSON lines in the job's control dir:
the input of `slurmtools report`'s plots, which need the whole history the Prometheus gauges do
not keep.

    <control dir>/steps/<attempt id>.rank<N>.jsonl
    <control dir>/steps/<attempt id>.node-<host>.by<N>.jsonl     (gathered per node: node_steps.py)

One file per rank (or per node's taker) and attempt, so no two processes ever append to the same
file. Lines are
buffered and written at most every flush_interval_s (and on flush()), so a step costs no file
system round trip; a rank killed between flushes loses at most that many seconds of lines,
which the report shows as a gap. A line that is not a well-formed record is skipped on reading.
"""
from __future__ import annotations

import json
import math
import operator
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from slurmtools.common.fsutil import read_json_lines
from slurmtools.train.node_steps import NODE_STEP_KIND, NodeSteps

STEPS_DIR = "steps"
DEFAULT_FLUSH_INTERVAL_S = 5.0
# one rank's file of one attempt: about 150 B a step, so a million steps; a larger file is skipped
MAX_STEPLOG_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class StepRecord:
    """One finished step of one rank; None: not measured."""
    attempt_id: str
    rank: int
    host: str
    step: int
    time_s: float                       # epoch seconds when the step finished
    step_s: float
    loss: Optional[float] = None
    tokens: Optional[int] = None
    collective_s: Optional[float] = None
    data_wait_s: Optional[float] = None
    ranks: int = 1                      # gathered per node: the node's ranks in it (rank: its lowest,
    slowest_rank: Optional[int] = None  # loss: that rank's; step_s: slowest_rank's; tokens: their sum)


@dataclass(frozen=True)
class CheckpointRecord:
    """A checkpoint rank 0 saved: its step, when it was done and how long training waited for it."""
    attempt_id: str
    step: int
    time_s: float
    save_s: float
    requested: bool = False


def _finite(value: Any) -> bool:
    """A real number (an int of any size compares exactly; math.isfinite would overflow on one)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _within(value: Any, low: float, high: float) -> bool:
    return _finite(value) and low <= value <= high


# What a measured value may be (a record outside these is malformed and skipped): the plots and
# sums of the report need numbers they can scale, and no real step takes a year.
MAX_INDEX = 2 ** 53                  # steps, ranks, tokens
MAX_TIME_S = 1e12                    # epoch seconds
MAX_DURATION_S = 365 * 24 * 3600.0   # a step, a save, a wait
MAX_ABS_LOSS = 1e30


MEASURED_LIMITS: Dict[str, Tuple[float, float]] = {
    "loss": (-MAX_ABS_LOSS, MAX_ABS_LOSS), "tokens": (0, MAX_INDEX), "grad_norm": (0, MAX_ABS_LOSS),
    "collective_s": (0, MAX_DURATION_S), "data_wait_s": (0, MAX_DURATION_S)}


def as_number(value: Any) -> Any:
    """A trainer's number as a Python int or float (numpy and torch scalars too); None for anything
    else. Ints stay ints (a step, a token count)."""
    if value is None or isinstance(value, bool) or isinstance(value, (int, float)):
        return None if isinstance(value, bool) else value
    try:
        return operator.index(value)
    except TypeError:
        pass
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def plausible(step: Any, step_s: Any) -> bool:
    """Whether a step number and its duration can be recorded at all."""
    return isinstance(step, int) and _within(step, 0, MAX_INDEX) and _within(step_s, 0, MAX_DURATION_S)


def plausible_measurements(measured: Dict[str, Any]) -> Dict[str, Any]:
    """The measurements that are real numbers within MEASURED_LIMITS (tokens: an integer); the rest
    are dropped as not measured, so a trainer's odd number never breaks our bookkeeping or the report."""
    return {name: value for name, value in measured.items()
            if name in MEASURED_LIMITS and _within(value, *MEASURED_LIMITS[name])
            and (name != "tokens" or isinstance(value, int))}


def _step(record: Dict[str, Any]) -> Optional[StepRecord]:
    rank: Any = record.get("rank")
    time_s: Any = record.get("time_s")
    names = ("loss", "tokens", "collective_s", "data_wait_s")
    given = {name: record[name] for name in names if record.get(name) is not None}
    measured = plausible_measurements(given)
    if not (isinstance(rank, int) and _within(rank, 0, MAX_INDEX) and plausible(record.get("step"), record.get("step_s"))
            and _within(time_s, 0, MAX_TIME_S) and len(measured) == len(given)
            and "attempt_id" in record and "host" in record):
        return None
    return StepRecord(str(record["attempt_id"]), rank, str(record["host"]), record["step"], float(time_s),
                      float(record["step_s"]), **measured)


def _node_step(record: Dict[str, Any]) -> Optional[StepRecord]:
    """A node's record of one step (node_steps.aggregate), or None when malformed."""
    ranks: Any = record.get("ranks")
    slowest: Any = record.get("slowest_rank")
    one = _step(record)
    if one is None or not (isinstance(ranks, int) and 1 <= ranks <= MAX_INDEX
                           and isinstance(slowest, int) and _within(slowest, 0, MAX_INDEX)):
        return None
    return replace(one, ranks=ranks, slowest_rank=slowest)


def merge(first: StepRecord, second: StepRecord) -> StepRecord:
    """Two partial records of one node's step (its ranks' lines taken at two moments) as one."""
    low = first if first.rank <= second.rank else second
    slow = first if first.step_s >= second.step_s else second

    def most(name: str) -> Optional[float]:
        values = [value for value in (getattr(first, name), getattr(second, name)) if value is not None]
        return max(values) if values else None
    tokens = None if first.tokens is None and second.tokens is None else (first.tokens or 0) + (second.tokens or 0)
    return replace(low, time_s=max(first.time_s, second.time_s), step_s=slow.step_s, tokens=tokens,
                   collective_s=most("collective_s"), data_wait_s=most("data_wait_s"),
                   ranks=first.ranks + second.ranks, slowest_rank=slow.slowest_rank)


def _checkpoint(record: Dict[str, Any]) -> Optional[CheckpointRecord]:
    step: Any = record.get("step")
    time_s: Any = record.get("time_s")
    save_s: Any = record.get("save_s")
    if not (isinstance(step, int) and _within(step, 0, MAX_INDEX) and _within(time_s, 0, MAX_TIME_S)
            and _within(save_s, 0, MAX_DURATION_S) and "attempt_id" in record):
        return None
    return CheckpointRecord(str(record["attempt_id"]), step, float(time_s), float(save_s),
                            bool(record.get("requested", False)))


class StepLog:
    """The writer of one rank in one attempt."""

    def __init__(self, control_dir: Path, attempt_id: str, rank: int, host: str, *,
                 flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, node_dir: Optional[Path] = None,
                 gathers: bool = False) -> None:
        """node_dir: this node's directory in node memory (node_beat.node_dir), where step lines go
        to be gathered per node; gathers: this is the node's local rank 0."""
        self.path = control_dir / STEPS_DIR / f"{attempt_id}.rank{rank}.jsonl"
        self.attempt_id, self.rank, self.host = attempt_id, rank, host
        self.node = (NodeSteps(node_dir, control_dir / STEPS_DIR, attempt_id, rank, host, gathers)
                     if node_dir is not None else None)
        self.flush_interval_s = flush_interval_s
        self.clock = clock
        self._pending: List[Tuple[str, str]] = []       # (kind, line)
        self._flushed_t = clock()

    def step(self, step: int, step_s: float, **measured: Optional[float]) -> None:
        if not plausible(step, step_s):
            return
        values = plausible_measurements(measured)
        self._add({"kind": "step", "attempt_id": self.attempt_id, "rank": self.rank, "host": self.host,
                   "step": step, "time_s": round(time.time(), 3), "step_s": step_s, **values})

    def checkpoint(self, step: int, save_s: float, *, requested: bool = False) -> None:
        self._add({"kind": "checkpoint", "attempt_id": self.attempt_id, "step": step,
                   "time_s": round(time.time(), 3), "save_s": save_s, "requested": requested})
        self.flush()       # rare and what the timeline is about: written at once

    def _add(self, record: Dict[str, Any]) -> None:
        self._pending.append((record["kind"], json.dumps(record, sort_keys=True, allow_nan=False)))
        if self.clock() - self._flushed_t >= self.flush_interval_s:
            self.flush()

    def flush(self, last: bool = False) -> None:
        """Write the buffered lines; gathered per node, step lines go to node memory and the node's
        are taken (local rank 0 at every flush, every rank at its last: training done or stopped)."""
        self._flushed_t = self.clock()
        pending, self._pending = self._pending, []
        if self.node is not None:
            self.node.put([line for kind, line in pending if kind == "step"])
            pending = [(kind, line) for kind, line in pending if kind != "step"]
            if self.node.gathers or last:
                self.node.take()
        if not pending:
            return
        text = "".join(line + "\n" for _, line in pending)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as handle:
            handle.write(text)


@dataclass(frozen=True)
class StepHistory:
    steps: List[StepRecord]
    checkpoints: List[CheckpointRecord]


def read(control_dir: Path) -> StepHistory:
    """Every rank's steps and rank 0's checkpoints, in time order; malformed lines are skipped."""
    steps: List[StepRecord] = []
    checkpoints: List[CheckpointRecord] = []
    directory = control_dir / STEPS_DIR
    files = sorted(directory.glob("*.jsonl")) if directory.is_dir() else []
    nodes: Dict[Tuple[str, str, int], StepRecord] = {}
    for path in files:
        for record in read_json_lines(path, MAX_STEPLOG_BYTES) or []:    # no FIFO, link or huge file
            if record.get("kind") == "step":
                step = _step(record)
                if step is not None:
                    steps.append(step)
            elif record.get("kind") == NODE_STEP_KIND:
                node = _node_step(record)
                if node is not None:
                    key = (node.attempt_id, node.host, node.step)
                    nodes[key] = merge(nodes[key], node) if key in nodes else node
            elif record.get("kind") == "checkpoint":
                checkpoint = _checkpoint(record)
                if checkpoint is not None:
                    checkpoints.append(checkpoint)
    steps += nodes.values()
    steps.sort(key=lambda s: (s.time_s, s.rank))
    checkpoints.sort(key=lambda c: c.time_s)
    return StepHistory(steps, checkpoints)
