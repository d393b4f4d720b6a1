"""`slurmtools run`: the supervisor the generated sbatch script execs around the srun launch.

One attempt = one run of the batch script. The supervisor starts the step, pumps its output
(keeping a tail as evidence), turns the warning signal into a checkpoint request, watches the
heartbeats, and when the step ends asks the pure policy what to do: complete, stop with a
summary, or requeue (excluding and draining an attributed node). Every decision is a JSON
line carrying the attempt id, and the ledger remembers attempts across requeues.
"""
from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Deque, Dict, List, Mapping, Optional, Sequence

from slurmtools import drain, slurm
from slurmtools.checkpoint import Checkpoint, CheckpointManager
from slurmtools.errors import SlurmCommandError, UsageError
from slurmtools.fsutil import write_json_atomic
from slurmtools.requeue import ledger, policy, watchdog
from slurmtools.runtime import (ATTEMPT_ID_ENV, COMPLETE_FILE, CONTROL_DIR_ENV, HEARTBEAT_DIR, REQUEST_FILE,
                                STOPPED_FILE, attempt_of)
from slurmtools.signals import SignalFlags, signal_number
from slurmtools.spec import RequeueSpec

TAIL_LINES = 300
STARTUP_ALLOWANCE_S = 120.0
DOWN_STATES = ("down", "fail", "failing")


@dataclass(frozen=True)
class SupervisorConfig:
    requeue: RequeueSpec
    control_dir: Path
    checkpoint_dir: Optional[Path] = None
    poll_s: float = 0.5
    stop_timeout_s: float = 8.0


@dataclass(frozen=True)
class Attempt:
    """Who this run of the batch script is."""

    job_id: Optional[int]
    restart: int
    attempt_id: str
    nodelist: str


@dataclass
class Watch:
    """What happened while the step ran."""

    exit_code: Optional[int] = None
    killed_by_us: bool = False
    stall: Optional[watchdog.Stall] = None


def emit(event: str, attempt_id: str, **fields: object) -> None:
    """One JSON line on stdout (the job's output file) per supervisor event."""
    print(json.dumps({"slurmtools": event, "attempt_id": attempt_id, "t": round(time.time(), 3), **fields},
                     sort_keys=True, default=str), flush=True)


class _Pump(threading.Thread):
    """Copy a child's stream to ours, keeping the last lines as evidence."""

    def __init__(self, src: IO[bytes], dst: IO[str], tail: Deque[str]) -> None:
        super().__init__(daemon=True)
        self.src, self.dst, self.tail = src, dst, tail

    def run(self) -> None:
        for raw in iter(self.src.readline, b""):
            line = raw.decode(errors="replace")
            self.tail.append(line)
            try:
                self.dst.write(line)
                self.dst.flush()
            except (OSError, ValueError):
                pass


def _ensure_control_dir(control_dir: Path) -> None:
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


def _prepare_control_dir(control_dir: Path) -> None:
    """Markers and heartbeats belong to one attempt: clear the previous attempt's."""
    _ensure_control_dir(control_dir)
    for name in (REQUEST_FILE, STOPPED_FILE, COMPLETE_FILE):
        _remove(control_dir / name)
    heartbeats = control_dir / HEARTBEAT_DIR
    if heartbeats.is_symlink() or (heartbeats.exists() and not heartbeats.is_dir()):
        _remove(heartbeats)
    heartbeats.mkdir(exist_ok=True)
    for path in heartbeats.iterdir():
        _remove(path)


def _marker(path: Path) -> bool:
    """A marker counts only as a regular file (a directory named `complete` is no completion)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _stop_child(child: "subprocess.Popen[bytes]", timeout_s: float) -> None:
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


def _node_states(nodelist: str) -> Dict[str, str]:
    if not nodelist:
        return {}
    try:
        return {node.name: node.state for node in slurm.nodes(nodelist)}
    except SlurmCommandError:
        return {}


def _ended_for_good(job_id: Optional[int], restart: int) -> bool:
    """After a SIGTERM: is Slurm ending the job for good (scancel, time limit) rather than requeueing it?

    While the job completes, scontrol says COMPLETING either way; a requeue has already raised
    Restarts above this attempt's SLURM_RESTART_COUNT, a cancel has not (measured on 22.05).
    """
    if job_id is None:
        return False
    try:
        record = slurm.show_job(job_id, survive_sigterm=True)
    except SlurmCommandError:
        return False
    if not record:
        return False
    restarts = record.get("Restarts", "0")
    return restarts.isdigit() and int(restarts) <= restart


def _close_dangling_attempt(control: Path, events: List[ledger.Event],
                            checkpoint_step: Optional[int]) -> Optional[ledger.AttemptEnd]:
    """An attempt with a start but no end was killed with its supervisor (its node died, or
    Slurm's KillWait ran out): record its end from the heartbeats it left, before they are cleared."""
    last = ledger.open_attempt(events)
    if last is None:
        return None
    beats = watchdog.read_heartbeats(control)
    states = _node_states(last.nodes)
    down = sorted(node for node, state in states.items() if state in DOWN_STATES)
    cause = policy.Cause.NODE_FAILURE if down else policy.Cause.CRASH
    end = ledger.AttemptEnd(
        attempt_id=last.attempt_id, time_s=max((beat.time_s for beat in beats), default=last.time_s),
        cause=cause.value, counted=True, action=policy.Action.REQUEUE.value,
        detail="supervisor was killed before recording the end", node=down[0] if down else None,
        last_step=max((beat.step for beat in beats), default=None),
        first_step_t=watchdog.first_progress(beats), checkpoint_step=checkpoint_step)
    ledger.append(control, end)
    return end


def _warned_before_start(job_id: Optional[int], lead_s: int) -> bool:
    """The script ignores the warning signal until this process handles it (a warning landing
    during bash's prelude or Python's start-up would otherwise kill the job): when the time
    left is already inside the warning lead, the warning was due, and is treated as received."""
    if job_id is None:
        return False
    try:
        end_s = slurm.job_end_time(job_id)
    except SlurmCommandError:
        return False
    return end_s is not None and end_s - time.time() <= lead_s


def _begin(config: SupervisorConfig, attempt: Attempt, manager: Optional[CheckpointManager]
           ) -> "tuple[List[ledger.Event], Optional[Checkpoint]]":
    """Close a dangling attempt, clear the control dir, record and announce this attempt's start."""
    control = config.control_dir
    _ensure_control_dir(control)
    events = ledger.read(control)
    resume = manager.latest() if manager else None
    dangling = _close_dangling_attempt(control, events, resume.step if resume else None)
    if dangling:
        events.append(dangling)
    _prepare_control_dir(control)
    ledger.append(control, ledger.AttemptStart(attempt.attempt_id, time.time(), attempt.restart, attempt.nodelist,
                                               resume.step if resume else None))
    emit("start", attempt.attempt_id, nodes=attempt.nodelist, resume_step=resume.step if resume else None,
         resume_path=str(resume.path) if resume else None)
    return events, resume


def _watch(config: SupervisorConfig, attempt: Attempt, child: "subprocess.Popen[bytes]", flags: SignalFlags,
           start_t: float) -> Watch:
    """Until the step ends: warning -> checkpoint request (and the grace timer), heartbeats -> hang."""
    control = config.control_dir
    requeue = config.requeue
    requested_at: Optional[float] = None
    watch = Watch()
    invalid_seen = 0
    while child.poll() is None:
        now = time.time()
        if flags.any() and requested_at is None:
            requested_at = now
            try:
                write_json_atomic(control / REQUEST_FILE, {"signals": flags.names(), "t": now}, durable=False)
            except OSError as exc:
                emit("control_error", attempt.attempt_id, error=f"cannot write {REQUEST_FILE}: {exc}")
            emit("checkpoint_requested", attempt.attempt_id, signals=flags.names())
        if requested_at is not None and now - requested_at > requeue.checkpoint_grace_s:
            emit("grace_expired", attempt.attempt_id, grace_s=requeue.checkpoint_grace_s)
            _stop_child(child, config.stop_timeout_s)
            watch.killed_by_us = True
            break
        if requeue.hang_timeout_s > 0 and requested_at is None:
            beats, invalid = watchdog.scan_heartbeats(control, now)
            if invalid > invalid_seen:
                invalid_seen = invalid
                emit("invalid_heartbeats", attempt.attempt_id, count=invalid)
            stall = watchdog.judge(beats, now, requeue.hang_timeout_s)
            if stall is None and not beats and now - start_t > requeue.hang_timeout_s + STARTUP_ALLOWANCE_S:
                stall = watchdog.Stall(now - start_t, None, None, 0)
            if stall is not None:
                emit("hang", attempt.attempt_id, idle_s=round(stall.idle_s, 1), rank=stall.rank, host=stall.host,
                     step=stall.step)
                _stop_child(child, config.stop_timeout_s)
                watch.killed_by_us = True
                watch.stall = stall
                break
        time.sleep(config.poll_s)
    watch.exit_code = child.wait()
    return watch


def _evidence(config: SupervisorConfig, attempt: Attempt, watch: Watch, flags: SignalFlags, tail: Deque[str],
              resume: Optional[Checkpoint]) -> "tuple[policy.Evidence, List[watchdog.Beat]]":
    control = config.control_dir
    beats = watchdog.read_heartbeats(control)
    last_step = max((beat.step for beat in beats), default=None)
    evidence = policy.Evidence(
        exit_code=None if watch.killed_by_us else watch.exit_code,
        complete_marker=_marker(control / COMPLETE_FILE),
        stopped_for_requeue=_marker(control / STOPPED_FILE),
        warning_received=flags.any(),
        cancelled=flags.seen(signal.SIGTERM) and _ended_for_good(attempt.job_id, attempt.restart),
        hang_detected=watch.stall is not None,
        hang_rank=watch.stall.rank if watch.stall else None,
        hang_node=watch.stall.host if watch.stall else None,
        log_tail="".join(tail),
        progressed=last_step is not None and last_step > (resume.step if resume else 0),
        node_states=_node_states(attempt.nodelist),
    )
    return evidence, beats


def _decide(config: SupervisorConfig, attempt: Attempt, evidence: policy.Evidence, beats: List[watchdog.Beat],
            events: List[ledger.Event], manager: Optional[CheckpointManager], exit_code: Optional[int]
            ) -> "tuple[policy.Diagnosis, policy.Verdict, Optional[int]]":
    """Classify, decide, and record the attempt's end in the ledger and the job's output."""
    newest = manager.latest(checksums=False) if manager else None
    checkpoint_step = newest.step if newest else None
    diag = policy.classify(evidence)
    verdict = policy.decide(diag, ledger.history(events), config.requeue, checkpoint_step)
    if attempt.job_id is None and verdict.action is policy.Action.REQUEUE:
        verdict = replace(verdict, action=policy.Action.STOP,
                          reason=verdict.reason + "; not under Slurm, cannot requeue")
    last_step = max((beat.step for beat in beats), default=None)
    ledger.append(config.control_dir, ledger.AttemptEnd(
        attempt_id=attempt.attempt_id, time_s=time.time(), cause=diag.cause.value, counted=verdict.counted,
        action=verdict.action.value, detail=diag.detail, reason=verdict.reason, node=diag.node,
        exit_code=exit_code, last_step=last_step, first_step_t=watchdog.first_progress(beats),
        checkpoint_step=checkpoint_step))
    emit("decision", attempt.attempt_id, cause=diag.cause.value, action=verdict.action.value, reason=verdict.reason,
         node=diag.node, exclude=verdict.exclude_node, drain=verdict.drain_node, exit_code=exit_code,
         last_step=last_step, checkpoint_step=checkpoint_step)
    return diag, verdict, checkpoint_step


def run(config: SupervisorConfig, argv: Sequence[str], environ: Optional[Mapping[str, str]] = None) -> int:
    """One attempt: begin, launch, watch, judge, then complete, stop or requeue."""
    env = dict(os.environ if environ is None else environ)
    job_id, restart, attempt_id = attempt_of(env)
    attempt = Attempt(job_id, restart, attempt_id, env.get("SLURM_JOB_NODELIST", ""))
    warn_sig = signal_number(config.requeue.warning_signal)
    flags = SignalFlags().install({warn_sig, signal.SIGTERM, signal.SIGINT, signal.SIGUSR2})
    manager = CheckpointManager(config.checkpoint_dir) if config.checkpoint_dir else None
    events, resume = _begin(config, attempt, manager)
    if _warned_before_start(job_id, config.requeue.warning_lead_s):
        os.kill(os.getpid(), warn_sig)      # the flag handler records it like the real one
    child_env = dict(env, **{CONTROL_DIR_ENV: str(config.control_dir), ATTEMPT_ID_ENV: attempt_id})
    tail: Deque[str] = collections.deque(maxlen=TAIL_LINES)
    start_t = time.time()
    try:
        child = subprocess.Popen(list(argv), env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        emit("stop", attempt_id, reason=f"cannot start {argv[0]}: {exc}")
        return 1
    assert child.stdout is not None and child.stderr is not None
    pumps = [_Pump(child.stdout, sys.stdout, tail), _Pump(child.stderr, sys.stderr, tail)]
    for pump in pumps:
        pump.start()
    try:
        watch = _watch(config, attempt, child, flags, start_t)
    finally:   # whatever happened above, the step (in its own session) does not outlive us
        if child.poll() is None:
            _stop_child(child, config.stop_timeout_s)
        for pump in pumps:
            pump.join(timeout=5)
        child.stdout.close()
        child.stderr.close()
    evidence, beats = _evidence(config, attempt, watch, flags, tail, resume)
    diag, verdict, checkpoint_step = _decide(config, attempt, evidence, beats, events, manager, watch.exit_code)
    if verdict.action is policy.Action.COMPLETE:
        return 0
    if verdict.action is policy.Action.STOP:
        failures = sum(1 for record in ledger.history(events) if record.counted) + (1 if verdict.counted else 0)
        print(f"slurmtools: STOP after attempt {attempt_id}: {verdict.reason} "
              f"(failures so far: {failures}, last checkpoint step: {checkpoint_step if checkpoint_step is not None else 'none'})",
              file=sys.stderr, flush=True)
        return 1
    assert job_id is not None
    return _requeue(job_id, attempt_id, diag, verdict, flags)


def _requeue(job_id: int, attempt_id: str, diag: policy.Diagnosis, verdict: policy.Verdict,
             flags: SignalFlags) -> int:
    """Requeue ourselves; with an exclusion or a backoff: hold, update, release (an update of
    ExcNodeList is refused while the job runs, but accepted at once once it is held)."""
    if verdict.drain_node:
        reason = drain.DrainReason("CRITICAL", f"job.{diag.cause.value}", diag.detail, str(job_id))
        try:
            drained = drain.drain(verdict.drain_node, reason)
            emit("drain", attempt_id, node=verdict.drain_node, reason=reason.render(), applied=drained)
        except SlurmCommandError as exc:
            emit("drain_failed", attempt_id, node=verdict.drain_node, error=str(exc))
    if flags.seen(signal.SIGTERM):
        # Slurm is already ending this run (its own requeue, node failure or preemption).
        emit("requeue", attempt_id, by="slurm")
        return 0
    try:
        if verdict.exclude_node or verdict.backoff_s > 0:
            fields = _requeue_fields(job_id, verdict)
            slurm.requeue_excluding(job_id, fields)
            emit("requeue", attempt_id, by="slurmtools", **{key.lower(): value for key, value in fields.items()})
        else:
            slurm.requeue(job_id)
            emit("requeue", attempt_id, by="slurmtools")
    except SlurmCommandError as exc:
        print(f"slurmtools: requeue of job {job_id} failed: {exc}", file=sys.stderr, flush=True)
        return 1
    # Slurm now ends this run; wait to be terminated rather than racing it with an exit code.
    deadline = time.time() + 60
    while time.time() < deadline and not flags.seen(signal.SIGTERM):
        time.sleep(0.2)
    return 0


def _requeue_fields(job_id: int, verdict: policy.Verdict) -> Dict[str, str]:
    """ExcNodeList (the blamed node added to what is already excluded) and StartTime (backoff)."""
    fields: Dict[str, str] = {}
    if verdict.exclude_node:
        from ClusterShell.NodeSet import NodeSet
        excluded = (slurm.show_job(job_id) or {}).get("ExcNodeList", "(null)")
        nodeset = NodeSet(verdict.exclude_node)
        if excluded not in ("", "(null)"):
            nodeset.update(excluded)
        fields["ExcNodeList"] = str(nodeset)
    if verdict.backoff_s > 0:
        fields["StartTime"] = f"now+{int(round(verdict.backoff_s))}"
    return fields
