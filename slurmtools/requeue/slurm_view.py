"""What the supervisor asks Slurm about its own job and nodes, and the ledger repair that needs it:
node states (a node of the attempt down), whether a SIGTERM ends the job for good, and the end of
an attempt whose supervisor was killed with it."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Set

from slurmtools.common import ledger
from slurmtools.errors import SlurmCommandError
from slurmtools.requeue import nodecheck, policy, step, watchdog
from slurmtools.slurm import commands as slurm

def node_states(nodelist: str) -> Dict[str, str]:
    """Each node's base state; not_responding when Slurm flags it so and its slurmd answers
    neither of our two probes (a failure on a node whose slurmd does not answer is a node failure;
    one missed ping of a loaded node that answers us is no evidence); else drained when it has the
    DRAIN flag (a health check drained it while the step ran: evidence too)."""
    if not nodelist:
        return {}
    try:
        found = slurm.nodes(nodelist)
        flagged = [node.name for node in found if "NOT_RESPONDING" in node.flags]
        endpoints = slurm.slurmd_endpoints(",".join(flagged)) if flagged else {}
    except SlurmCommandError:
        return {}
    # a flagged node the controller gives no address for keeps Slurm's word
    silent = set(nodecheck.silent_twice(endpoints)) | (set(flagged) - set(endpoints))
    return {node.name: _state(node, silent) for node in found}


def _state(node: slurm.NodeInfo, silent: Set[str]) -> str:
    if node.name in silent:
        return policy.NOT_RESPONDING
    if node.drained and node.state not in policy.DOWN_STATES:
        return policy.DRAINED
    return node.state


def ended_for_good(job_id: Optional[int], restart: int) -> bool:
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


def close_dangling_attempt(control: Path, events: List[ledger.Event],
                            checkpoint_step: Optional[int]) -> Optional[ledger.AttemptEnd]:
    """An attempt with a start but no end was killed with its supervisor (its node died, or
    Slurm's KillWait ran out): record its end from the heartbeats it left, before they are cleared.
    When its ranks had checkpointed on request and stopped (a person's requeue, a preemption: Slurm
    SIGKILLed the supervisor KillWait after its SIGTERM, before the ranks' exit reached it, R46),
    or its supervisor had recorded Slurm's SIGTERM (a save longer than KillWait) and no node of it
    is down, it ended preempted, not counted."""
    last = ledger.open_attempt(events)
    if last is None:
        return None
    beats = watchdog.read_heartbeats(control)
    states = node_states(last.nodes)
    down = sorted(node for node, state in states.items() if state in policy.DOWN_STATES)
    stopped = step.stopped_for_requeue_by(control, last.attempt_id) or (
        step.term_received_by(control, last.attempt_id) and not down)
    cause = (policy.Cause.PREEMPTED if stopped else policy.Cause.NODE_FAILURE if down else policy.Cause.CRASH)
    end = ledger.AttemptEnd(
        attempt_id=last.attempt_id, time_s=max((beat.time_s for beat in beats), default=last.time_s),
        cause=cause.value, counted=not stopped, action=policy.Action.REQUEUE.value,
        detail="supervisor was killed before recording the end" + (
            " (the ranks had stopped for the requeue)" if step.stopped_for_requeue_by(control, last.attempt_id)
            else " (Slurm's SIGTERM had come: a preemption or a requeue)" if stopped else ""),
        node=down[0] if down and not stopped else None,
        last_step=max((beat.step for beat in beats), default=None),
        first_step_t=watchdog.first_progress(beats), checkpoint_step=checkpoint_step,
        last_step_t=watchdog.last_progress(beats))
    ledger.append(control, end)
    return end
