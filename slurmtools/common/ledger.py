"""The per-job ledger: one typed event per attempt start and end, as JSON lines in the control dir.

It is the supervisor's memory across requeues (failure budget, no-progress guard) and the
input of `slurmtools goodput` (requeue/goodput.py). Every record is written and read here; a
line that is not a valid event (torn, foreign, wrongly typed) is skipped, never fatal.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional, Tuple, Union, get_args, get_origin, get_type_hints

from slurmtools.common.fsutil import json_lines
from slurmtools.errors import UsageError

LEDGER_FILE = "ledger.jsonl"
# a few hundred bytes per attempt and straggler window: a month of restarts stays far below this
MAX_LEDGER_BYTES = 64 * 1024 * 1024
# Numbers a record may hold: steps, exit codes and counts within a double's exact integers; times
# (epoch seconds) and durations far beyond any real one. Past these the goodput arithmetic would
# overflow or lose its meaning, so such a record is malformed.
MAX_RECORD_INT = 2 ** 53
MAX_RECORD_FLOAT = 1e12


class Cause(str, Enum):
    """Why an attempt ended: what the supervisor decided on, and what the ledger keeps."""

    COMPLETED = "completed"
    PREEMPTED = "preempted"              # warning signal / requeue by a person, checkpointed or not
    NODE_FAILURE = "node_failure"
    COLLECTIVE_TIMEOUT = "collective_timeout"
    HANG = "hang"
    GPU_FATAL = "gpu_fatal"
    OOM = "oom"
    USER_ERROR = "user_error"
    CRASH = "crash"
    CANCELLED = "cancelled"
    STRAGGLER = "straggler"              # checkpointed away from a persistently slow node
    SDC = "sdc"                          # the canary found ranks computing wrong results
    PREFLIGHT = "preflight"              # the check before training named a node (wrong, slow, slow link)


@dataclass(frozen=True)
class AttemptRecord:
    """One earlier attempt, as the ledger remembers it."""

    cause: Cause
    counted: bool
    checkpoint_step: Optional[int]
    node: Optional[str] = None
    time_s: Optional[float] = None   # when it ended (older ledgers: unknown, always inside the window)


_CAUSES = frozenset(cause.value for cause in Cause)


@dataclass(frozen=True)
class AttemptStart:
    KIND: ClassVar[str] = "start"
    attempt_id: str
    time_s: float
    restart: int = 0
    nodes: str = ""
    resume_step: Optional[int] = None


@dataclass(frozen=True)
class AttemptEnd:
    KIND: ClassVar[str] = "end"
    attempt_id: str
    time_s: float
    cause: str                       # a policy.Cause value
    counted: bool = False            # against the restart budget
    action: Optional[str] = None     # a policy.Action value
    detail: str = ""
    reason: str = ""
    node: Optional[str] = None
    exit_code: Optional[int] = None
    last_step: Optional[int] = None
    first_step_t: Optional[float] = None
    checkpoint_step: Optional[int] = None
    last_step_t: Optional[float] = None      # when its newest step was done (absent in older ledgers)
    excluded: str = ""                       # the nodes the decision excluded, comma-separated (exclusions.py)


@dataclass(frozen=True)
class NodeSlowdown:
    """A straggler window in which some node was at or above the straggler factor (every window
    goes to the job's output; only these to the ledger, naming only those nodes), and the verdict
    once one is a straggler."""
    KIND: ClassVar[str] = "slowdown"
    attempt_id: str
    time_s: float
    first_step: int
    last_step: int
    slowdown: Dict[str, float]               # node at or above the factor -> its slowest rank's busy time
                                             # per step / the other nodes' ranks' median
    straggler: Optional[str] = None
    action: str = ""                         # with a straggler: "swap" (a spare is left) or "report"


@dataclass(frozen=True)
class PreflightCheck:
    """The check of an allocation's nodes before its first training step."""
    KIND: ClassVar[str] = "preflight"
    attempt_id: str
    time_s: float
    status: str                              # passed | failed | error | skipped
    nodes: str = ""
    wall_s: float = 0.0
    named: Dict[str, str] = dataclasses.field(default_factory=dict)   # node -> check and measurements
    detail: str = ""


@dataclass(frozen=True)
class CheckpointRefused:
    """A checkpoint passed over on resume (a checksum mismatch, a file that cannot be read), with
    why: the trainer's rank 0 writes it, the resume went on from an older one."""
    KIND: ClassVar[str] = "checkpoint_refused"
    attempt_id: str
    time_s: float
    path: str
    why: str


@dataclass(frozen=True)
class SnapshotRestore:
    """How a trainer's step started with in-memory snapshots on (docs/snapshots.md): from the
    snapshot of `step`, or (step None) from the persistent checkpoint, and why; rank 0 writes it."""
    KIND: ClassVar[str] = "snapshot_restore"
    attempt_id: str
    time_s: float
    step: Optional[int]
    why: str
    restore_s: float = 0.0


@dataclass(frozen=True)
class InPlaceRecovery:
    """A failure the step survived (docs/recovery.md, "In place"): a lost node's ranks started
    again on spares, or ranks that crashed on a live node started again there (cause crash, spares
    then the same nodes), into the next generation, while every other rank kept its process.
    Counted against the restart budget as any such failure is."""
    KIND: ClassVar[str] = "in_place"
    attempt_id: str
    time_s: float
    generation: int
    lost: str                               # comma-separated
    spares: str
    detail: str = ""
    checkpoint_step: Optional[int] = None    # the newest complete checkpoint then: the budget's progress marker
    cause: str = Cause.NODE_FAILURE.value    # node_failure, hang or crash


Event = Union[AttemptStart, AttemptEnd, NodeSlowdown, PreflightCheck, CheckpointRefused, SnapshotRestore,
              InPlaceRecovery]
_KINDS: Dict[str, Any] = {cls.KIND: cls for cls in (AttemptStart, AttemptEnd, NodeSlowdown, PreflightCheck,
                                                     CheckpointRefused, SnapshotRestore, InPlaceRecovery)}


def append(control_dir: Path, event: Event) -> None:
    """Append one line with O_APPEND + fsync: a killed writer leaves whole lines or one torn last line."""
    control_dir.mkdir(parents=True, exist_ok=True)
    record = {"event": event.KIND, **dataclasses.asdict(event)}
    line = (json.dumps(record, sort_keys=True, allow_nan=False) + "\n").encode()
    path = control_dir / LEDGER_FILE
    try:        # never blocks on a FIFO (no reader: ENXIO at once) nor follows a link put there
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o644)
    except OSError as exc:
        raise UsageError(f"ledger {path}: cannot be written ({exc.strerror}); it must be a regular file") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"ledger {path}: not a regular file; it must be one")
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def _valid(kind: Any, value: Any) -> bool:
    if get_origin(kind) is Union:
        return any(_valid(arg, value) for arg in get_args(kind))
    if get_origin(kind) is dict:
        key_kind, value_kind = get_args(kind)
        return isinstance(value, dict) and all(_valid(key_kind, key) and _valid(value_kind, item)
                                               for key, item in value.items())
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_RECORD_INT
    if kind is float:
        return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                and abs(value) <= MAX_RECORD_FLOAT)
    return isinstance(value, kind)


def parse(record: Dict[str, Any]) -> Optional[Event]:
    """One ledger record as its event, or None when it is not a well-formed one."""
    cls = _KINDS.get(str(record.get("event")))
    if cls is None:
        return None
    hints = get_type_hints(cls)
    values = {}
    for field in dataclasses.fields(cls):
        if field.name in record:
            if not _valid(hints[field.name], record[field.name]):
                return None
            values[field.name] = record[field.name]
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            return None
    event: Event = cls(**values)
    if isinstance(event, (AttemptEnd, InPlaceRecovery)) and event.cause not in _CAUSES:
        return None
    return event


# path -> (device, inode, bytes consumed: whole lines only, the last of those bytes, their events): a
# supervisor reads its job's ledger at every attempt start and judgement; only what was appended
# since is parsed again. The last bytes consumed must still be there: a file rewritten in place, or
# a new one that got a removed one's inode, is read whole again.
_READ: Dict[str, Tuple[int, int, int, bytes, List[Event]]] = {}
_CHECK_BYTES = 256


def _events(raw: bytes) -> List[Event]:
    parsed = (parse(record) for record in json_lines(raw.decode(errors="replace")))
    return [event for event in parsed if event is not None]


def read(path: Path) -> List[Event]:
    """Events from a ledger file (or a control dir); malformed lines are skipped. A ledger that is
    not a regular file (a FIFO, a link) or is past MAX_LEDGER_BYTES reads as empty. Read
    incrementally: the lines read before in this process (the same file, grown) are not parsed again."""
    if path.is_dir():
        path = path / LEDGER_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return []
    key = str(path.absolute())
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_LEDGER_BYTES:
            return []
        device, inode, consumed, last, events = _READ.get(key, (info.st_dev, info.st_ino, 0, b"", []))
        if ((device, inode) != (info.st_dev, info.st_ino) or consumed > info.st_size
                or os.pread(fd, len(last), consumed - len(last)) != last):
            consumed, last, events = 0, b"", []     # replaced or rewritten: read it whole again
        raw = os.pread(fd, info.st_size - consumed + 1, consumed)
    except OSError:
        return []
    finally:
        os.close(fd)
    whole = raw.rfind(b"\n") + 1          # a torn last line is parsed now and again when it is whole
    if whole:
        events = events + _events(raw[:whole])
        last = (last + raw[:whole])[-_CHECK_BYTES:]
    _READ[key] = (info.st_dev, info.st_ino, consumed + whole, last, events)
    return events + _events(raw[whole:])


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
    last_step_s: Optional[float] = None


def attempts(events: List[Event]) -> List[Attempt]:
    """Attempts in start order, each with its end when one was recorded."""
    starts: Dict[str, AttemptStart] = {}
    ends: Dict[str, AttemptEnd] = {}
    for event in events:
        if isinstance(event, AttemptStart):
            starts[event.attempt_id] = event
        elif isinstance(event, AttemptEnd):
            ends[event.attempt_id] = event
    out = []
    for attempt_id, start in starts.items():
        end = ends.get(attempt_id)
        out.append(Attempt(attempt_id, start.time_s, end.time_s if end else None, start.resume_step,
                           end.first_step_t if end else None, end.last_step if end else None,
                           end.checkpoint_step if end else None, end.cause if end else None,
                           end.action if end else None, bool(end and end.counted), end.node if end else None,
                           end.last_step_t if end else None))
    return out


# the causes of a recovery in place that blame the lost node (a crash blames none)
_NODE_CAUSES = (Cause.NODE_FAILURE.value, Cause.HANG.value)


def history(events: List[Event]) -> List[AttemptRecord]:
    """Failures as the policy sees them (oldest first): each finished attempt with its progress
    marker, and each node failure a step survived in place (at its time, before its attempt's end)."""
    restored = restored_steps(events)
    ended = [AttemptRecord(Cause(a.cause), a.counted, progress_step(a.checkpoint_step, restored.get(a.attempt_id)),
                           a.node, a.end_s)
             for a in attempts(events) if a.cause is not None]
    survived = [AttemptRecord(Cause(event.cause), True, event.checkpoint_step,
                              event.lost.split(",")[0] if event.cause in _NODE_CAUSES else None,
                              event.time_s)
                for event in events if isinstance(event, InPlaceRecovery)]
    if not survived:
        return ended
    return sorted(ended + survived, key=lambda record: record.time_s if record.time_s is not None else 0.0)


def restored_steps(events: List[Event]) -> Dict[str, int]:
    """Attempt id -> the in-memory snapshot's step it restored from (its snapshot_restore record)."""
    return {event.attempt_id: event.step for event in events
            if isinstance(event, SnapshotRestore) and event.step is not None}


def progress_step(checkpoint_step: Optional[int], restored_step: Optional[int]) -> Optional[int]:
    """What the restart budget counts as progress (policy: "no newer checkpoint"): the newest
    complete checkpoint, or the snapshot the attempt restored from when that is newer. With
    snapshots, a run that goes on from snapshot to snapshot between rare checkpoints progresses;
    one that fails again and again after restoring the same snapshot does not."""
    steps = [step for step in (checkpoint_step, restored_step) if step is not None]
    return max(steps) if steps else None


def attempt_progress_step(control_dir: Path, attempt_id: str, checkpoint_step: Optional[int]) -> Optional[int]:
    """progress_step of an attempt ending now (its restore record came after the attempt began)."""
    return attempt_progress_of(read(control_dir), attempt_id, checkpoint_step)


def attempt_progress_of(events: List[Event], attempt_id: str, checkpoint_step: Optional[int]) -> Optional[int]:
    """attempt_progress_step from a ledger already read."""
    return progress_step(checkpoint_step, restored_steps(events).get(attempt_id))


def ever_trained(events: List[Event]) -> bool:
    """An earlier attempt of this job finished a training step (its failures since are the platform's
    as much as the program's: the policy does not call them user errors)."""
    return any(a.last_step is not None and a.last_step > (a.resume_step or 0) for a in attempts(events))


def open_attempt(events: List[Event]) -> Optional[AttemptStart]:
    """The newest attempt when it has a start but no end (it died with its supervisor)."""
    starts = [event for event in events if isinstance(event, AttemptStart)]
    if not starts:
        return None
    last = starts[-1]
    ended = any(isinstance(event, AttemptEnd) and event.attempt_id == last.attempt_id for event in events)
    return None if ended else last


def newest_checkpoint_step(events: List[Event]) -> Optional[int]:
    """The newest checkpoint step the ledger records for the job (resumed from, or newest at an
    attempt's end); None when the job never had one."""
    steps = [event.resume_step for event in events if isinstance(event, AttemptStart)]
    steps += [event.checkpoint_step for event in events if isinstance(event, AttemptEnd)]
    return max((step for step in steps if step is not None), default=None)
