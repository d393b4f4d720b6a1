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
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Deque, Dict, Optional, Sequence

from slurmtools import drain, slurm
from slurmtools.checkpoint import CheckpointManager
from slurmtools.errors import SlurmCommandError
from slurmtools.requeue import ledger, policy, watchdog
from slurmtools.requeue.signals import SignalFlags, signal_number
from slurmtools.runtime import COMPLETE_FILE, HEARTBEAT_DIR, REQUEST_FILE, STOPPED_FILE

TAIL_LINES = 300
STARTUP_ALLOWANCE_S = 120.0


@dataclass(frozen=True)
class SupervisorConfig:
    limits: policy.Limits
    control_dir: Path
    checkpoint_dir: Optional[Path] = None
    hang_timeout_s: float = 600.0
    checkpoint_grace_s: float = 120.0
    warning_signal: str = "USR1"
    poll_s: float = 0.5
    stop_timeout_s: float = 8.0


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


def _prepare_control_dir(control_dir: Path) -> None:
    """Markers and heartbeats belong to one attempt: clear the previous attempt's."""
    control_dir.mkdir(parents=True, exist_ok=True)
    for name in (REQUEST_FILE, STOPPED_FILE, COMPLETE_FILE):
        (control_dir / name).unlink(missing_ok=True)
    hb = control_dir / HEARTBEAT_DIR
    hb.mkdir(exist_ok=True)
    for f in hb.iterdir():
        f.unlink(missing_ok=True)


def _stop_child(child: subprocess.Popen, timeout_s: float) -> None:
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
        return {n.name: n.state for n in slurm.nodes(nodelist)}
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
        rec = slurm.show_job(job_id, survive_sigterm=True)
    except SlurmCommandError:
        return False
    if not rec:
        return False
    restarts = rec.get("Restarts", "0")
    return restarts.isdigit() and int(restarts) <= restart


def _close_dangling_attempt(control: Path, records: list, checkpoint_step: Optional[int]) -> Optional[dict]:
    """An attempt with a start but no end was killed with its supervisor (its node died, or
    Slurm's KillWait ran out): record its end from the heartbeats it left, before they are cleared."""
    started = [r for r in records if r.get("event") == "start"]
    if not started:
        return None
    last = started[-1]
    if any(r.get("event") == "end" and r.get("attempt_id") == last.get("attempt_id") for r in records):
        return None
    beats = watchdog.read_heartbeats(control)
    states = _node_states(str(last.get("nodes", "")))
    down = sorted(n for n, st in states.items() if st in ("down", "fail", "failing"))
    cause = policy.Cause.NODE_FAILURE if down else policy.Cause.CRASH
    end = {"event": "end", "attempt_id": last.get("attempt_id"),
           "t": max((b.time_s for b in beats), default=float(last.get("t", time.time()))),
           "cause": cause.value, "node": down[0] if down else None, "counted": True,
           "detail": "supervisor was killed before recording the end", "action": "requeue",
           "last_step": max((b.step for b in beats), default=None),
           "first_step_t": watchdog.first_progress(beats),
           "checkpoint_step": checkpoint_step}
    ledger.append(control, end)
    return end


def run(cfg: SupervisorConfig, argv: Sequence[str]) -> int:
    env = os.environ
    job_id = int(env["SLURM_JOB_ID"]) if env.get("SLURM_JOB_ID", "").isdigit() else None
    restart = int(env.get("SLURM_RESTART_COUNT", "0") or 0)
    attempt_id = env.get("SLURMTOOLS_ATTEMPT_ID") or f"{job_id or 'local'}.{restart}"
    nodelist = env.get("SLURM_JOB_NODELIST", "")
    control = cfg.control_dir
    control.mkdir(parents=True, exist_ok=True)
    records = ledger.read(control)
    manager = CheckpointManager(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
    resume = manager.latest() if manager else None
    dangling = _close_dangling_attempt(control, records, resume.step if resume else None)
    if dangling:
        records.append(dangling)
    _prepare_control_dir(control)
    start_t = time.time()
    ledger.append(control, {"event": "start", "attempt_id": attempt_id, "t": start_t, "restart": restart,
                            "nodes": nodelist, "resume_step": resume.step if resume else None})
    emit("start", attempt_id, nodes=nodelist, resume_step=resume.step if resume else None,
         resume_path=str(resume.path) if resume else None)

    warn_sig = signal_number(cfg.warning_signal)
    flags = SignalFlags().install({warn_sig, signal.SIGTERM, signal.SIGINT, signal.SIGUSR2})
    child_env = dict(env, SLURMTOOLS_CONTROL_DIR=str(control), SLURMTOOLS_ATTEMPT_ID=attempt_id,
                     SLURMTOOLS_RESUME_CHECKPOINT=str(resume.path) if resume else "")
    tail: Deque[str] = collections.deque(maxlen=TAIL_LINES)
    try:
        child = subprocess.Popen(list(argv), env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        emit("stop", attempt_id, reason=f"cannot start {argv[0]}: {exc}")
        return 1
    pumps = [_Pump(child.stdout, sys.stdout, tail), _Pump(child.stderr, sys.stderr, tail)]  # type: ignore[arg-type]
    for p in pumps:
        p.start()

    requested_at: Optional[float] = None
    stall: Optional[watchdog.Stall] = None
    killed_by_us = False
    while child.poll() is None:
        now = time.time()
        if flags.any() and requested_at is None:
            requested_at = now
            (control / REQUEST_FILE).write_text(json.dumps({"signals": flags.names(), "t": now}))
            emit("checkpoint_requested", attempt_id, signals=flags.names())
        if requested_at is not None and now - requested_at > cfg.checkpoint_grace_s:
            emit("grace_expired", attempt_id, grace_s=cfg.checkpoint_grace_s)
            _stop_child(child, cfg.stop_timeout_s)
            killed_by_us = True
            break
        if cfg.hang_timeout_s > 0 and requested_at is None:
            beats = watchdog.read_heartbeats(control)
            stall = watchdog.judge(beats, now, cfg.hang_timeout_s)
            if stall is None and not beats and now - start_t > cfg.hang_timeout_s + STARTUP_ALLOWANCE_S:
                stall = watchdog.Stall(now - start_t, None, None, 0)
            if stall is not None:
                emit("hang", attempt_id, idle_s=round(stall.idle_s, 1), rank=stall.rank, host=stall.host,
                     step=stall.step)
                _stop_child(child, cfg.stop_timeout_s)
                killed_by_us = True
                break
        time.sleep(cfg.poll_s)
    exit_code = child.wait()
    for p in pumps:
        p.join(timeout=5)

    beats = watchdog.read_heartbeats(control)
    last_step = max((b.step for b in beats), default=None)
    first_beat = watchdog.first_progress(beats)
    now_ckpt = manager.latest(checksums=False) if manager else None
    cancelled = flags.seen(signal.SIGTERM) and _ended_for_good(job_id, restart)
    evidence = policy.Evidence(
        exit_code=None if killed_by_us else exit_code,
        complete_marker=(control / COMPLETE_FILE).exists(),
        stopped_for_requeue=(control / STOPPED_FILE).exists(),
        warning_received=flags.any(),
        cancelled=cancelled,
        hang_detected=stall is not None,
        hang_rank=stall.rank if stall else None,
        hang_node=stall.host if stall else None,
        log_tail="".join(tail),
        progressed=last_step is not None and last_step > (resume.step if resume else 0),
        node_states=_node_states(nodelist),
    )
    diag = policy.classify(evidence)
    verdict = policy.decide(diag, ledger.history(records), cfg.limits, now_ckpt.step if now_ckpt else None)
    if job_id is None and verdict.action is policy.Action.REQUEUE:
        verdict = replace(verdict, action=policy.Action.STOP, reason=verdict.reason + "; not under Slurm, cannot requeue")
    ledger.append(control, {"event": "end", "attempt_id": attempt_id, "t": time.time(), "cause": diag.cause.value,
                            "detail": diag.detail, "node": diag.node, "action": verdict.action.value,
                            "reason": verdict.reason, "counted": verdict.counted, "exit_code": exit_code,
                            "last_step": last_step, "first_step_t": first_beat,
                            "checkpoint_step": now_ckpt.step if now_ckpt else None})
    emit("decision", attempt_id, cause=diag.cause.value, action=verdict.action.value, reason=verdict.reason,
         node=diag.node, exclude=verdict.exclude_node, drain=verdict.drain_node, exit_code=exit_code,
         last_step=last_step, checkpoint_step=now_ckpt.step if now_ckpt else None)
    if verdict.action is policy.Action.COMPLETE:
        return 0
    if verdict.action is policy.Action.STOP:
        failures = sum(1 for a in ledger.history(records) if a.counted) + (1 if verdict.counted else 0)
        print(f"slurmtools: STOP after attempt {attempt_id}: {verdict.reason} "
              f"(failures so far: {failures}, last checkpoint step: {now_ckpt.step if now_ckpt else 'none'})",
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
            rec = slurm.show_job(job_id) or {}
            excluded = rec.get("ExcNodeList", "(null)")
            fields: Dict[str, str] = {}
            if verdict.exclude_node:
                from ClusterShell.NodeSet import NodeSet
                ns = NodeSet(verdict.exclude_node)
                if excluded not in ("", "(null)"):
                    ns.update(excluded)
                fields["ExcNodeList"] = str(ns)
            if verdict.backoff_s > 0:
                fields["StartTime"] = f"now+{int(round(verdict.backoff_s))}"
            slurm.requeue_excluding(job_id, fields)
            emit("requeue", attempt_id, by="slurmtools", **{k.lower(): v for k, v in fields.items()})
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
