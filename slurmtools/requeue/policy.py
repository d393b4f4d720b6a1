"""Pure failure classification and the decision matrix.

classify(evidence) -> Diagnosis; decide(diagnosis, history, settings, checkpoint, capacity) -> Verdict.
No I/O, no clock: every row is a table-driven unit test. The matrix (docs/user-guide.md, section 2):
completed -> done; warning / preemption / a person's requeue -> requeue, not counted;
a failure no node is blamed for (crash after progress, collective timeout, unattributed hang,
OOM when allowed) -> restart in the allocation (a new step, no queue wait); a blamed node
(node death, fatal XID, hung rank, silent data corruption, a node preflight named) -> restart without it on a spare or on fewer nodes when the
allocation allows, else requeue excluding it (and drain it when the evidence is strong); a
straggler the supervisor checkpointed away from -> the same, drained, not counted;
user error (a user-error pattern, or no step ever trained in this job) -> stop; a platform failure
(rendezvous, launch, transport, storage I/O) -> a crash, also before progress; OOM -> stop unless
allowed; budget spent (counted failures within restart_window_h), same failure N
times in a row (same cause and node, no newer checkpoint in between), no newer checkpoint across K
restarts -> stop with a summary. Restarts in
place and requeues share that one budget.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

# the ledger records these, so they are defined with it; the policy speaks them
from slurmtools.common.ledger import AttemptRecord as AttemptRecord, Cause as Cause
from slurmtools.common.xid import XID_LINE, node_fault_xids
from slurmtools.requeue import output_signs as signs
from slurmtools.spec import RequeueSpec


class Action(str, Enum):
    COMPLETE = "complete"
    RESTART = "restart"          # a new step in the same allocation
    REQUEUE = "requeue"
    STOP = "stop"


@dataclass(frozen=True)
class Evidence:
    """Everything the supervisor observed about one attempt."""

    exit_code: Optional[int]                 # srun's exit code (None: still running / killed by us)
    complete_marker: bool = False            # rank 0 wrote `complete`
    stopped_for_requeue: bool = False        # ranks checkpointed on request and exited
    warning_received: bool = False           # warning signal or SIGTERM (preemption / person's requeue)
    cancelled: bool = False                  # Slurm ends the job for good (scancel, time limit): no requeue follows
    stop_requested: bool = False             # its user asked it to checkpoint and stop (SIGINT: cancel --graceful)
    hang_rank: Optional[int] = None          # watchdog: laggard rank (None: no hang or not attributable)
    hang_detected: bool = False
    hang_node: Optional[str] = None
    hang_detail: str = ""                    # the flight recorder's account of a hang, when it named the rank
    log_tail: str = ""                       # last lines of the job step's output
    progressed: bool = True                  # any step finished in this attempt
    earlier_progress: bool = False           # an earlier attempt of this job trained, or a checkpoint exists
    reports_progress: bool = True            # the program uses TrainingControl (its marker, a heartbeat)
    node_states: Dict[str, str] = field(default_factory=dict)  # allocation node -> Slurm base state
    dead_node: Optional[str] = None          # every rank on it silent and its slurmd unreachable
    dead_detail: str = ""
    dead_also: Tuple[str, ...] = ()          # more nodes of the step whose slurmd did not answer either
    collective_laggard_node: Optional[str] = None   # flight-recorder dumps name the rank that never entered
    collective_laggard_detail: str = ""
    sdc_found: bool = False                  # the trainer's SDC canary stopped training (its marker)
    sdc_node: Optional[str] = None
    sdc_also: Tuple[str, ...] = ()           # more nodes the canary named with sdc_node
    sdc_detail: str = ""
    straggler_node: Optional[str] = None     # the supervisor asked for a checkpoint to swap it out
    straggler_detail: str = ""
    preflight_node: Optional[str] = None     # the preflight before training named it
    preflight_check: str = ""                # e.g. preflight.busbw
    preflight_detail: str = ""
    handled_nodes: Tuple[str, ...] = ()      # dead nodes this run already replaced and gave back
    gpu_fault_node: Optional[str] = None     # its GPU reported a hardware-class XID while the step ran (NVML)
    gpu_fault_detail: str = ""
    gpu_fault_also: Tuple[str, ...] = ()     # more nodes whose GPUs did
    rank_lost: str = ""                      # in place: srun named a rank's failure on a live node, not restarted


@dataclass(frozen=True)
class Capacity:
    """What the running allocation can still do without Slurm's queue."""

    in_allocation: bool = False                     # a new step may be launched here
    replaceable: FrozenSet[str] = frozenset()       # nodes the job can go on without (each alone)
    slack: Optional[int] = None                     # how many of them it can lose together (None: one)


@dataclass(frozen=True)
class Diagnosis:
    cause: Cause
    node: Optional[str] = None       # attributed node, when known
    detail: str = ""
    fatal_for_node: bool = False     # evidence strong enough to drain the node
    check: str = ""                  # the drain reason's check (default: job.<cause>)
    also_nodes: Tuple[str, ...] = ()  # lost together with node, on the same evidence
    aftermath: bool = False          # Slurm's own removal of a node failure already handled ended the step
    by_user: bool = False            # its user stopped it (cancel --graceful), not Slurm


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str
    counted: bool = False            # counts against the restart budget
    exclude_node: Optional[str] = None
    drain_node: Optional[str] = None
    backoff_s: float = 0.0
    also_nodes: Tuple[str, ...] = ()  # excluded with exclude_node (and drained with drain_node)
    cancel_job: bool = False         # the supervisor ends its job CANCELLED, as its user's scancel would

    @property
    def excluded(self) -> Tuple[str, ...]:
        return (self.exclude_node, *self.also_nodes) if self.exclude_node else ()

    @property
    def drained(self) -> Tuple[str, ...]:
        return (self.drain_node, *self.also_nodes) if self.drain_node else ()


# a node's Slurm state that is evidence of its failure (slurm_view adds not_responding: Slurm's
# NOT_RESPONDING flag, whatever the base state)
NOT_RESPONDING = "not_responding"
DOWN_STATES = ("down", "fail", "failing", NOT_RESPONDING)
# slurm_view gives a node with Slurm's DRAIN flag this state (down and not responding rank first):
# a graceful cancel (`slurmtools cancel --graceful`: SIGINT to the supervisor): checkpoint, then stop
USER_STOP = "its user asked it to checkpoint and stop"

# a health check (the site's, or our gate) drained it while the step ran, the GPU fault that
# crashed a rank, say, whose XID is only in that node's kernel log
DRAINED = "drained"


def classify(evidence: Evidence) -> Diagnosis:
    """The cause of an attempt's end, and the node to blame when the evidence names one."""
    ev = evidence
    down = sorted(node for node, state in ev.node_states.items() if state in DOWN_STATES)
    node_fail = signs.NODE_FAIL.search(ev.log_tail)
    if ev.preflight_node:
        return Diagnosis(Cause.PREFLIGHT, node=ev.preflight_node, detail=ev.preflight_detail,
                         fatal_for_node=True, check=ev.preflight_check)
    if ev.complete_marker:
        # training finished and its final checkpoint is committed; a non-zero exit here comes
        # from teardown (e.g. a rendezvous shutdown race), not from training
        return Diagnosis(Cause.COMPLETED, detail="" if ev.exit_code == 0 else f"exit {ev.exit_code} after completion")
    if ev.cancelled:
        return Diagnosis(Cause.CANCELLED, detail="cancelled or out of time; Slurm is not requeueing it")
    if ev.stop_requested:
        return Diagnosis(Cause.CANCELLED, detail=USER_STOP + (": checkpointed first" if ev.stopped_for_requeue else
                                                              ": it did not checkpoint in time"), by_user=True)
    if ev.straggler_node and not ev.warning_received and (ev.stopped_for_requeue or ev.exit_code is None):
        return Diagnosis(Cause.STRAGGLER, node=ev.straggler_node, detail=ev.straggler_detail or
                         f"node={ev.straggler_node}", fatal_for_node=True)
    # Slurm's own SIGTERM when it ends the run for a node's failure is no preemption: the node is
    # down, or the step's log says "Node failure on X" (Slurm can say so before it marks it down)
    if ev.stopped_for_requeue or (ev.warning_received and not ev.hang_detected
                                  and (ev.exit_code == 0 or not (down or node_fail))):
        return Diagnosis(Cause.PREEMPTED, detail="checkpointed on request" if ev.stopped_for_requeue
                         else "warning signal")
    if ev.exit_code == 0 and not ev.reports_progress:
        # every rank exited 0 and nothing asked it to stop: a program that tells us nothing has
        # completed when it says so (a node lost after its end is no reason to run it again)
        return Diagnosis(Cause.COMPLETED, detail="exit 0 on every rank (the program reports no progress; "
                                                 "its exit is its completion)")
    if ev.dead_node:
        return Diagnosis(Cause.NODE_FAILURE, node=ev.dead_node, detail=ev.dead_detail or f"node {ev.dead_node} died",
                         fatal_for_node=True, also_nodes=tuple(n for n in ev.dead_also if n != ev.dead_node))
    if slurm_removal_aftermath(ev):
        return Diagnosis(Cause.NODE_FAILURE, detail=f"the step ended (exit {ev.exit_code}) as Slurm removed "
                         f"{','.join(ev.handled_nodes)} (dead, already replaced) from the job", aftermath=True)
    if ev.sdc_found:
        return Diagnosis(Cause.SDC, node=ev.sdc_node, detail=ev.sdc_detail or "silent data corruption",
                         fatal_for_node=ev.sdc_node is not None, also_nodes=ev.sdc_also if ev.sdc_node else ())
    if node_fail or down:
        node = node_fail.group(1).rstrip(":,") if node_fail else down[0]
        return Diagnosis(Cause.NODE_FAILURE, node=node, detail=f"node {node} failed",
                         also_nodes=tuple(n for n in down if n != node))
    if ev.gpu_fault_node and (ev.exit_code not in (None, 0) or ev.hang_detected):
        # the rank's own process saw the XID (gpu_events.py): the node, not the job, failed
        return Diagnosis(Cause.GPU_FATAL, node=ev.gpu_fault_node, detail=ev.gpu_fault_detail, fatal_for_node=True,
                         also_nodes=ev.gpu_fault_also)
    drained = sorted(node for node, state in ev.node_states.items() if state == DRAINED)
    if drained and ev.exit_code not in (None, 0):
        # replaced like a lost node, not drained again by us (the drain and its reason are theirs)
        first = signs.first_failed_node(ev.log_tail)
        node = first if first in drained else drained[0]
        return Diagnosis(Cause.NODE_FAILURE, node=node, detail=f"node {node} was drained in Slurm while the step ran "
                         f"(a health check's verdict); the step failed (exit {ev.exit_code})",
                         also_nodes=tuple(n for n in drained if n != node))
    fatal = node_fault_xids(ev.log_tail)     # drain- or reboot-class in NVIDIA's catalogue
    if fatal:
        return Diagnosis(Cause.GPU_FATAL, node=signs.blamed_host(ev.log_tail, XID_LINE), detail=f"xid={fatal[0]}",
                         fatal_for_node=True)
    if ev.hang_detected:
        return Diagnosis(Cause.HANG, node=ev.hang_node,
                         detail=ev.hang_detail or (f"no heartbeat from rank {ev.hang_rank}" if ev.hang_rank is not None
                                                   else "no heartbeat from any rank"),
                         fatal_for_node=ev.hang_node is not None)
    if signs.OOM.search(ev.log_tail):
        return Diagnosis(Cause.OOM, detail="out of memory")
    if ev.rank_lost:
        # its peers' broken-group errors in the tail are the rank's fallout, not a collective's timeout
        user = signs.USER.search(ev.log_tail)
        return (Diagnosis(Cause.USER_ERROR, detail=user.group(1)) if user
                else Diagnosis(Cause.CRASH, detail=ev.rank_lost))
    if signs.COLLECTIVE.search(ev.log_tail):
        if ev.collective_laggard_node:
            return Diagnosis(Cause.COLLECTIVE_TIMEOUT, node=ev.collective_laggard_node,
                             detail=f"collective timeout: {ev.collective_laggard_detail}")
        return Diagnosis(Cause.COLLECTIVE_TIMEOUT, node=signs.blamed_host(ev.log_tail, signs.COLLECTIVE),
                         detail="collective timeout")
    if ev.exit_code == 0:
        # clean exit without the complete marker: the program ended early on its own
        return Diagnosis(Cause.USER_ERROR, detail="exited 0 before training completed")
    user = signs.USER.search(ev.log_tail)
    if user:
        return Diagnosis(Cause.USER_ERROR, detail=user.group(1))
    infra = signs.platform_failure(ev.log_tail)
    if infra:
        return Diagnosis(Cause.CRASH, detail=f"exit {ev.exit_code}, infrastructure: {infra.group(1)}")
    if not ev.progressed and not ev.earlier_progress and ev.reports_progress:
        # nothing of this job ever trained: the program or its environment is broken (a program that
        # reports no progress may have trained: its crash counts, within the budget)
        return Diagnosis(Cause.USER_ERROR, detail=f"exit {ev.exit_code} before the first step")
    return Diagnosis(Cause.CRASH, detail=f"exit {ev.exit_code}" + ("" if ev.progressed else " before the first step"))


def slurm_removal_aftermath(ev: Evidence) -> bool:
    """The step failed the way Slurm's own removal of a dead node ends one (SlurmdTimeout after
    the death, at a moment of its own): a node this run already replaced is named failed, the
    launch failed, or the first task to end was killed by a signal; and no new node is down, no
    rank ran out of memory. Part of that node failure, not a crash of the program."""
    if not ev.handled_nodes or ev.exit_code in (None, 0) or signs.OOM.search(ev.log_tail):
        return False
    if any(node not in ev.handled_nodes for node, state in ev.node_states.items() if state in DOWN_STATES):
        return False
    named = signs.NODE_FAIL.search(ev.log_tail)
    if named:
        return named.group(1).rstrip(":,") in ev.handled_nodes
    first = signs.FAILED_TASK.search(ev.log_tail)
    return bool(signs.LAUNCH_FAILED.search(ev.log_tail)) or (
        first is not None and first.group(3).strip() in ("Killed", "Terminated"))


def decide(diag: Diagnosis, history: Sequence[AttemptRecord], limits: RequeueSpec,
           checkpoint_step: Optional[int], capacity: Capacity = Capacity(), now_s: Optional[float] = None) -> Verdict:
    """What to do after an attempt ended with diag, given earlier attempts (oldest first); now_s
    (when it ended) places the failure budget's window."""
    if diag.cause is Cause.COMPLETED:
        return Verdict(Action.COMPLETE, "training completed")
    if diag.cause is Cause.PREEMPTED:
        return Verdict(Action.REQUEUE, f"preempted ({diag.detail}); not counted")
    if diag.cause is Cause.STRAGGLER:
        # nothing failed: not counted; each swap spends a spare, so it cannot repeat unbounded
        reason = f"straggler ({diag.detail}); not counted"
        if capacity.in_allocation and limits.in_allocation and diag.node in capacity.replaceable:
            return Verdict(Action.RESTART, reason, exclude_node=diag.node, drain_node=diag.node)
        return Verdict(Action.REQUEUE, reason, exclude_node=diag.node, drain_node=diag.node)
    if diag.cause is Cause.CANCELLED and diag.by_user:
        return Verdict(Action.STOP, f"cancelled: {diag.detail}", cancel_job=True)
    if diag.cause is Cause.CANCELLED:
        return Verdict(Action.STOP, "cancelled or out of time: Slurm ended the job and is not requeueing it")
    if diag.aftermath and history and history[-1].cause is Cause.NODE_FAILURE and history[-1].counted:
        # once per node failure: a second such end in a row is counted as the failure it then is
        reason = f"node_failure ({diag.detail}); part of the node failure before, not counted"
        in_place = capacity.in_allocation and limits.in_allocation
        return Verdict(Action.RESTART if in_place else Action.REQUEUE, reason)
    if diag.cause is Cause.USER_ERROR:
        return Verdict(Action.STOP, f"user error ({diag.detail}): a requeue would fail the same way")
    if diag.cause is Cause.OOM and not limits.retry_oom:
        return Verdict(Action.STOP, "out of memory: the same configuration would run out again")
    counted_before = in_window(history, limits.restart_window_h, now_s)
    if len(counted_before) + 1 > limits.max_restarts:
        return Verdict(Action.STOP, f"restart budget spent ({limits.max_restarts} failures{_window_words(limits)}): "
                       f"last {diag.cause.value} ({diag.detail})", counted=True)
    same = consecutive(diag, history, checkpoint_step)
    if same >= limits.max_consecutive_failures:
        return Verdict(Action.STOP, f"{diag.cause.value} {same} times in a row ({diag.detail})", counted=True)
    if _no_progress(history, checkpoint_step, limits.no_progress_restarts):
        return Verdict(Action.STOP, f"no newer checkpoint across {limits.no_progress_restarts} restarts "
                       f"(stuck at step {checkpoint_step})", counted=True)
    backoff = limits.backoff_s * (2 ** (same - 1))
    node = diag.node if diag.cause in (Cause.NODE_FAILURE, Cause.COLLECTIVE_TIMEOUT, Cause.HANG,
                                       Cause.GPU_FATAL, Cause.SDC, Cause.PREFLIGHT) else None
    # Slurm marks a node it saw fail down itself; a node we found dead first is drained by us
    drain = node if diag.fatal_for_node else None
    reason = f"{diag.cause.value} ({diag.detail})"
    also = diag.also_nodes if node is not None else ()
    if capacity.in_allocation and limits.in_allocation:
        if node is None:
            return Verdict(Action.RESTART, reason, counted=True, backoff_s=backoff)
        if _can_lose(capacity, (node, *also)):
            # the suspect nodes leave the step together: the cause is gone, no backoff
            return Verdict(Action.RESTART, reason, counted=True, exclude_node=node, drain_node=drain,
                           also_nodes=also)
    return Verdict(Action.REQUEUE, reason, counted=True, exclude_node=node, drain_node=drain, backoff_s=backoff,
                   also_nodes=also)


def _can_lose(capacity: Capacity, nodes: Sequence[str]) -> bool:
    """Every node replaceable, and (more than one) no more than the allocation can lose together."""
    if not all(node in capacity.replaceable for node in nodes):
        return False
    return len(nodes) == 1 or (capacity.slack is not None and len(nodes) <= capacity.slack)


def in_window(history: Sequence[AttemptRecord], window_h: float, now_s: Optional[float]) -> List[AttemptRecord]:
    """The counted failures the budget sees: those that ended within window_h of now_s (0 or no
    clock: all of them; a record without a time is inside)."""
    counted = [a for a in history if a.counted]
    if window_h <= 0 or now_s is None:
        return counted
    since = now_s - window_h * 3600.0
    return [a for a in counted if a.time_s is None or a.time_s >= since]


def consecutive(diag: Diagnosis, history: Sequence[AttemptRecord], checkpoint_step: Optional[int]) -> int:
    """This failure and the identical ones right before it: the same cause on the same node, with no
    newer checkpoint in between (progress between two crashes makes them two separate events)."""
    same = 1
    newer = checkpoint_step
    for earlier in reversed(history):
        if not earlier.counted:
            continue
        if earlier.cause is not diag.cause or earlier.node != diag.node or earlier.checkpoint_step != newer:
            break
        same += 1
        newer = earlier.checkpoint_step
    return same


def _window_words(limits: RequeueSpec) -> str:
    return f" within {limits.restart_window_h:g} h" if limits.restart_window_h > 0 else ""


def _no_progress(history: Sequence[AttemptRecord], checkpoint_step: Optional[int], restarts: int) -> bool:
    """True when the last `restarts` counted failures (this one included) all ended at the same checkpoint."""
    counted = [a for a in history if a.counted][-(restarts - 1):] if restarts > 1 else []
    if len(counted) < restarts - 1:
        return False
    return all(a.checkpoint_step == checkpoint_step for a in counted)

