"""Each rank's finished steps (and rank 0's checkpoints) as JSON lines in the job's control dir:
the input of `slurmtools report`'s plots, which need the whole history the Prometheus gauges do
not keep.

    <control dir>/steps/<attempt id>.rank<N>.jsonl

One file per rank and attempt, so no two processes ever append to the same file. Lines are
buffered and written at most every flush_interval_s (and on flush()), so a step costs no file
system round trip; a rank killed between flushes loses at most that many seconds of lines,
which the report shows as a gap. A line that is not a well-formed record is skipped on reading.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from slurmtools.fsutil import json_lines

STEPS_DIR = "steps"
DEFAULT_FLUSH_INTERVAL_S = 5.0


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


@dataclass(frozen=True)
class CheckpointRecord:
    """A checkpoint rank 0 saved: its step, when it was done and how long training waited for it."""
    attempt_id: str
    step: int
    time_s: float
    save_s: float
    requested: bool = False


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _step(record: Dict[str, Any]) -> Optional[StepRecord]:
    try:
        out = StepRecord(str(record["attempt_id"]), int(record["rank"]), str(record["host"]), int(record["step"]),
                         float(record["time_s"]), float(record["step_s"]),
                         *(record.get(name) for name in ("loss", "tokens", "collective_s", "data_wait_s")))
    except (KeyError, TypeError, ValueError):
        return None
    numbers = (out.time_s, out.step_s, *(v for v in (out.loss, out.tokens, out.collective_s, out.data_wait_s)
                                         if v is not None))
    return out if all(_finite(v) for v in numbers) else None


def _checkpoint(record: Dict[str, Any]) -> Optional[CheckpointRecord]:
    try:
        out = CheckpointRecord(str(record["attempt_id"]), int(record["step"]), float(record["time_s"]),
                               float(record["save_s"]), bool(record.get("requested", False)))
    except (KeyError, TypeError, ValueError):
        return None
    return out if _finite(out.time_s) and _finite(out.save_s) else None


class StepLog:
    """The writer of one rank in one attempt."""

    def __init__(self, control_dir: Path, attempt_id: str, rank: int, host: str, *,
                 flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = control_dir / STEPS_DIR / f"{attempt_id}.rank{rank}.jsonl"
        self.attempt_id, self.rank, self.host = attempt_id, rank, host
        self.flush_interval_s = flush_interval_s
        self.clock = clock
        self._pending: List[str] = []
        self._flushed_t = clock()

    def step(self, step: int, step_s: float, **measured: Optional[float]) -> None:
        values = {key: value for key, value in measured.items() if value is not None and _finite(value)}
        self._add({"kind": "step", "attempt_id": self.attempt_id, "rank": self.rank, "host": self.host,
                   "step": step, "time_s": round(time.time(), 3), "step_s": step_s, **values})

    def checkpoint(self, step: int, save_s: float, *, requested: bool = False) -> None:
        self._add({"kind": "checkpoint", "attempt_id": self.attempt_id, "step": step,
                   "time_s": round(time.time(), 3), "save_s": save_s, "requested": requested})
        self.flush()       # rare and what the timeline is about: written at once

    def _add(self, record: Dict[str, Any]) -> None:
        self._pending.append(json.dumps(record, sort_keys=True, allow_nan=False))
        if self.clock() - self._flushed_t >= self.flush_interval_s:
            self.flush()

    def flush(self) -> None:
        self._flushed_t = self.clock()
        if not self._pending:
            return
        text = "".join(line + "\n" for line in self._pending)
        self._pending = []
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
    for path in files:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for record in json_lines(text):
            if record.get("kind") == "step":
                step = _step(record)
                if step is not None:
                    steps.append(step)
            elif record.get("kind") == "checkpoint":
                checkpoint = _checkpoint(record)
                if checkpoint is not None:
                    checkpoints.append(checkpoint)
    steps.sort(key=lambda s: (s.time_s, s.rank))
    checkpoints.sort(key=lambda c: c.time_s)
    return StepHistory(steps, checkpoints)
