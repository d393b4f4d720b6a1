"""One job step's process and files: launch it with its output pumped (its first error lines and
its tail kept as evidence), stop it, and the control-dir markers it leaves. Effects only; no
decisions."""
from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Collection, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

from slurmtools.common import job_secret
from slurmtools.common.control_dir import (COMPLETE_FILE, FLIGHT_RECORDER_REQUEST_FILE, GENERATION_FILE,
                                           GENERATION_FORMED_PREFIX, GROUP_BROKEN_PREFIX,
                                           HEARTBEAT_DIR, REPORTS_PROGRESS_FILE, JOB_NODES_FILE,
                                           REQUEST_FILE, SDC_FILE, STANDBY_GO_PREFIX, STOPPED_FILE, TERM_FILE)
from slurmtools.common.fsutil import read_small_regular, write_json_atomic
from slurmtools.common.one_write import say
from slurmtools.errors import SlurmCommandError, UsageError
from slurmtools.slurm import commands as slurm
from slurmtools.train.gpu_events import GPU_EVENTS_DIR

TAIL_LINES = 300
# The first error lines of the step are kept beside its tail: at thousands of ranks the cascade
# (every rank's traceback, srun's line per task) pushes the first failing rank and its first error,
# what a decision and a person need, out of any tail.
FIRST_ERROR_LINES = 40
NOTABLE_LINE = re.compile(r"error|exception|traceback|killed|terminated|cancelled|fail|xid|timed? ?out|"
                          r"signal|abort|segmentation|oom", re.IGNORECASE)
EVIDENCE_LINE_CHARS = 4096        # a line kept as evidence, at most (the job's output keeps it whole)
READ_CHUNK_BYTES = 1 << 20        # one read of the step's output: a line longer comes in pieces
FIRST_ERRORS_MARK = "[slurmtools: the step's first error lines; its last lines follow]\n"
# how long a step with --overlap waits for the old steps to end: KillWait (30 s by default) and a margin
OVERLAP_WAIT_S = 60.0


def evidence_text(first_errors: Sequence[str], tail: Sequence[str]) -> str:
    """The step's output as evidence: its first error lines not already in the tail, then the tail."""
    in_tail = set(tail)
    early = [line for line in first_errors if line not in in_tail]
    return (FIRST_ERRORS_MARK + "".join(early) if early else "") + "".join(tail)


class _Pump(threading.Thread):
    """Copy a child's stream to ours, keeping its first error lines and its last lines as evidence."""

    def __init__(self, src: IO[bytes], dst: IO[str], tail: Deque[str], first_errors: List[str],
                 lock: threading.Lock, on_line: Optional[Callable[[str], None]] = None) -> None:
        super().__init__(daemon=True)
        self.src, self.dst, self.tail, self.on_line = src, dst, tail, on_line
        self.first_errors, self.lock = first_errors, lock

    def run(self) -> None:
        for raw in iter(lambda: self.src.readline(READ_CHUNK_BYTES), b""):
            line = raw.decode(errors="replace")
            kept = line if len(line) <= EVIDENCE_LINE_CHARS else line[:EVIDENCE_LINE_CHARS] + "\n"
            self.tail.append(kept)
            if len(self.first_errors) < FIRST_ERROR_LINES and NOTABLE_LINE.search(kept):
                with self.lock:
                    if len(self.first_errors) < FIRST_ERROR_LINES:
                        self.first_errors.append(kept)
            if self.on_line is not None:
                try:
                    self.on_line(kept)
                except Exception as exc:   # noqa: BLE001 - a dead pump would stall the step on a full pipe
                    self.on_line = None
                    say(f"slurmtools: progress from output lines off: {type(exc).__name__}: {exc}")
            try:
                self.dst.write(line)
                self.dst.flush()
            except (OSError, ValueError):
                pass


@dataclass
class Step:
    child: "subprocess.Popen[bytes]"
    pumps: List[_Pump]
    tail: Deque[str] = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    first_errors: List[str] = field(default_factory=list)

    def evidence(self) -> str:
        """Its first error lines and its tail (evidence_text)."""
        return evidence_text(list(self.first_errors), list(self.tail))

    def finish(self, stop_timeout_s: float) -> None:
        """Whatever happened, the step (in its own session) does not outlive us; its output is drained."""
        if self.child.poll() is None:
            stop(self.child, stop_timeout_s)
        for pump in self.pumps:
            pump.join(timeout=5)
        for stream in (self.child.stdout, self.child.stderr):
            if stream is not None:
                stream.close()


def launch(argv: Sequence[str], env: Mapping[str, str], on_line: Optional[Callable[[str], None]] = None) -> Step:
    """Start the step in its own session (raises OSError when it cannot start); on_line sees every
    line of its output."""
    child = subprocess.Popen(list(argv), env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    assert child.stdout is not None and child.stderr is not None
    tail: Deque[str] = collections.deque(maxlen=TAIL_LINES)
    first_errors: List[str] = []
    lock = threading.Lock()
    pumps = [_Pump(child.stdout, sys.stdout, tail, first_errors, lock, on_line),
             _Pump(child.stderr, sys.stderr, tail, first_errors, lock, on_line)]
    for pump in pumps:
        pump.start()
    return Step(child, pumps, tail, first_errors)


def stop(child: "subprocess.Popen[bytes]", timeout_s: float) -> None:
    """SIGTERM the step's process group, then SIGKILL: nothing is left running."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=timeout_s)
            return
        except subprocess.TimeoutExpired:
            continue


def kill_now(child: "subprocess.Popen[bytes]") -> None:
    """SIGKILL the step's srun at once: with a dead node in the step, srun would wait for that
    node (KillWait and more). The step's tasks on the live nodes go with kill_steps."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.wait()


def kill_steps(job_id: int) -> "tuple[List[str], List[str]]":
    """Cancel the job's parallel steps (their tasks on the nodes Slurm can reach); returns the
    steps and the errors. Nothing of the old step may keep running beside the next one."""
    errors: List[str] = []
    steps: List[str] = []
    try:
        steps = slurm.job_steps(job_id)
        for step_id in steps:
            slurm.cancel_step(step_id)
    except SlurmCommandError as exc:
        errors.append(str(exc))
    return steps, errors


def wait_steps_ended(job_id: int, stuck: Collection[str], timeout_s: float = OVERLAP_WAIT_S,
                     poll_s: float = 0.5) -> List[str]:
    """Before a step that runs with --overlap (Slurm then does not wait for the old step's
    resources): wait until the job's earlier steps have ended, their processes gone with the GPU
    memory they held (a hung rank's CUDA teardown takes seconds: the next step would run out of
    memory), but for those stuck open for good on a dead node. Returns those still running at
    timeout_s; a controller that cannot say stops the wait."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            running = [step_id for step_id in slurm.job_steps(job_id) if step_id not in stuck]
        except SlurmCommandError:
            return []
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(poll_s)


def ensure_control_dir(control_dir: Path) -> None:
    try:
        control_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UsageError(f"control dir {control_dir}: exists and is not a directory") from None
    except OSError as exc:
        raise UsageError(f"control dir {control_dir}: {exc.strerror}") from None


def _remove(path: Path) -> None:
    """Whatever is at path (a marker, or a directory or FIFO someone put in its place)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def prepare_control_dir(control_dir: Path) -> None:
    """Markers and heartbeats belong to one attempt: clear the previous attempt's. The job's key
    (job_secret) is made once, here, before any rank starts (ranks on other nodes then find it)."""
    ensure_control_dir(control_dir)
    try:
        job_secret.ensure(control_dir)
    except OSError as exc:
        raise UsageError(f"control dir {control_dir}: cannot make the job key: {exc.strerror}") from None
    for name in (REQUEST_FILE, STOPPED_FILE, COMPLETE_FILE, FLIGHT_RECORDER_REQUEST_FILE, SDC_FILE,
                 REPORTS_PROGRESS_FILE, TERM_FILE, GENERATION_FILE):
        _remove(control_dir / name)
    # an earlier step's word that its group broke would read as this step's (in-place recovery)
    for entry in os.scandir(control_dir):
        if entry.name.startswith((GROUP_BROKEN_PREFIX, GENERATION_FORMED_PREFIX, STANDBY_GO_PREFIX)):
            _remove(control_dir / entry.name)
    _remove(control_dir / GPU_EVENTS_DIR)
    heartbeats = control_dir / HEARTBEAT_DIR
    if heartbeats.is_symlink() or (heartbeats.exists() and not heartbeats.is_dir()):
        _remove(heartbeats)
    heartbeats.mkdir(exist_ok=True)
    for path in heartbeats.iterdir():
        _remove(path)


def sdc_record(control_dir: Path) -> Optional[Tuple[Optional[str], str, Tuple[str, ...]]]:
    """(node to blame or None, detail, the other nodes to blame) from the SDC canary's marker,
    when a well-formed one is there."""
    data = _json_object(control_dir / SDC_FILE, 65536)
    if data is None or not isinstance(data.get("detail"), str):
        return None
    node = data.get("node")
    node = node if isinstance(node, str) and node else None
    raw_nodes = data.get("nodes")
    listed: List[object] = raw_nodes if isinstance(raw_nodes, list) else []
    also = tuple(name for name in listed[:64] if isinstance(name, str) and name and name != node)
    return node, data["detail"][:500], also if node else ()


def job_nodes(control_dir: Path, allocated: int, first_run: bool) -> int:
    """The job's node count at its first run (runtime.JOB_NODES_FILE): recorded by that run,
    read back by every later one; 0 when unknown (a control dir of an older version)."""
    if first_run:
        try:
            ensure_control_dir(control_dir)
            write_json_atomic(control_dir / JOB_NODES_FILE, {"nodes": allocated})
        except (OSError, UsageError):
            pass              # unrecorded: a later run trains on its allocation, as before
        return allocated
    data = _json_object(control_dir / JOB_NODES_FILE, 4096)
    nodes = data.get("nodes") if data is not None else None
    return nodes if isinstance(nodes, int) and not isinstance(nodes, bool) and 0 < nodes <= 1_000_000 else 0


def term_received_by(control_dir: Path, attempt_id: str) -> bool:
    """The supervisor recorded Slurm's SIGTERM for this attempt (record_term)."""
    data = _json_object(control_dir / TERM_FILE, 4096)
    return data is not None and data.get("attempt_id") == attempt_id


def stopped_for_requeue_by(control_dir: Path, attempt_id: str) -> bool:
    """Rank 0's marker says this attempt's ranks checkpointed on request and stopped for a requeue."""
    data = _json_object(control_dir / STOPPED_FILE, 4096)
    return data is not None and data.get("attempt_id") == attempt_id


def _json_object(path: Path, max_bytes: int) -> Optional[Dict[str, Any]]:
    """A marker's JSON object (a regular file of at most max_bytes, as the job's ranks wrote it); None otherwise."""
    raw = read_small_regular(path, max_bytes)
    try:
        data = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def marker(path: Path) -> bool:
    """A marker counts only as a regular file (a directory named `complete` is no completion)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False
