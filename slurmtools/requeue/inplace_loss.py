"""In-place recovery, what a loss heard of while the step runs becomes (docs/recovery.md, "In
place"): a dead node's ranks started again on spares (on_death), a hung node's ranks ended and
started again on spares (on_hang), ranks that crashed on a live node started again there
(on_crash), or a loss that cannot be recovered in place, said for the relaunch (a second failure
while a recovery's generation forms among them).
Each recovery is checked against the restart budget and recorded in the ledger; the mechanics are
inplace_step's, the decisions inplace_plan's.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, List, Optional, Sequence

from slurmtools.checkpoint.manager import CheckpointManager
from slurmtools.common import generation, ledger
from slurmtools.common.control_dir import HEARTBEAT_DIR
from slurmtools.requeue import actions, inplace_plan, nodecheck, policy, watchdog
from slurmtools.requeue.actions import Run, emit
from slurmtools.requeue.inplace_step import InPlace
from slurmtools.spec import RequeueSpec
from slurmtools.train import gpu_events
from slurmtools.train.node_beat import node_file_name

# how long a node's word that its ranks' group broke waits for srun's word of the failed task
# behind it, when every slurmd answers (a crashed rank: srun says so within a poll or two); past
# it the loss is a rank's that srun never named, and the relaunch takes over
FAILED_TASK_WAIT_S = 5.0


def on_death(in_place: InPlace, dead: nodecheck.Death, detail: str, attempt_id: str, job_id: int, this_run: Run,
             node_watch: nodecheck.NodeWatch, manager: Optional[CheckpointManager],
             on_line: Optional[Callable[[str], None]]) -> bool:
    """Nodes found dead while the step runs: their ranks started again on spares, the step going
    on (True); or why not said, for the relaunch (False)."""
    spares = [node for node in this_run.topology.allocation if node not in this_run.lost]
    found = in_place.forming() or in_place.recover(dead.nodes, spares, on_line)
    if isinstance(found, str):
        emit("in_place_refused", attempt_id, nodes=list(dead.nodes), reason=found)
        return False
    diagnosis = policy.Diagnosis(policy.Cause.NODE_FAILURE, None, detail, fatal_for_node=True)
    _took_spares(in_place, found, diagnosis, job_id, this_run, node_watch, _newest_step(manager))
    return True


def on_hang(in_place: InPlace, stall: watchdog.Stall, limits: RequeueSpec, job_id: int, this_run: Run,
            node_watch: nodecheck.NodeWatch, manager: Optional[CheckpointManager],
            on_line: Optional[Callable[[str], None]]) -> bool:
    """The step hung behind one rank: its node's ranks ended there, the node drained and its ranks
    started again on a spare, every other rank keeping its process (True); or why not said, for
    the relaunch (False). A stall while a generation forms, or within a hang timeout of a hang
    recovered in place (the ranks' beats are that old until their first step in it), is that
    recovery's: waited out (True; the formation net stops a generation that never forms)."""
    attempt_id, now = in_place.attempt_id, time.monotonic()
    if in_place.forming() is not None:
        in_place.quiet_until = max(in_place.quiet_until, now + limits.hang_timeout_s / 2)
        return True
    if now < in_place.quiet_until:
        return True
    events, newest_step = ledger.read(in_place.control_dir), _newest_step(manager)
    detail = (f"rank {stall.rank} on {stall.host}: no step for {stall.idle_s:.0f} s (hang timeout "
              f"{limits.hang_timeout_s:g} s){'; ' + stall.detail if stall.detail else ''}")
    verdict = inplace_plan.hang_verdict(stall.rank, stall.host, stall.cut_off, detail, ledger.history(events), limits,
                                        ledger.attempt_progress_of(events, attempt_id, newest_step), time.time())
    spares = [node for node in this_run.topology.allocation if node not in this_run.lost]
    # the hung ranks' end first (a step that takes a second to start): one that cannot be started
    # leaves the recovery to the relaunch, which stops the whole step anyway
    found = ((in_place.end_ranks(str(stall.host)) or in_place.recover([str(stall.host)], spares, on_line))
             if isinstance(verdict, policy.Diagnosis) else verdict)
    if isinstance(found, str):
        emit("in_place_refused", attempt_id, nodes=[stall.host] if stall.host else [], reason=found)
        return False
    assert isinstance(verdict, policy.Diagnosis)
    emit("hang", attempt_id, idle_s=round(stall.idle_s, 1), rank=stall.rank, host=stall.host, step=stall.step,
         in_place=True)
    _took_spares(in_place, found, verdict, job_id, this_run, node_watch, newest_step)
    in_place.quiet_until = time.monotonic() + limits.hang_timeout_s
    return True


def _newest_step(manager: Optional[CheckpointManager]) -> Optional[int]:
    """The newest sealed checkpoint's step (its checksums not read: the ledger's record only)."""
    newest = manager.latest(checksums=False) if manager is not None else None
    return newest.step if newest is not None else None


def _took_spares(in_place: InPlace, found: inplace_plan.InPlacePlan, diagnosis: policy.Diagnosis, job_id: int,
                 this_run: Run, node_watch: nodecheck.NodeWatch, newest_step: Optional[int]) -> None:
    """After lost nodes' ranks started on spares: said, the nodes drained with the diagnosis's cause
    and no longer watched, recorded in the ledger."""
    now = time.time()
    lost = [replacement.lost for replacement in found.replacements]
    emit("in_place", in_place.attempt_id, generation=found.generation, lost=lost, spares=found.spares_used,
         warm=in_place.warm, ranks=[[r.first_rank, r.ranks] for r in found.replacements],
         cause=diagnosis.cause.value, detail=diagnosis.detail)
    for node in lost:
        # its ranks' last beats would stand for the replacements' (the same ranks): gone with it. A
        # hung node's ender removes the file again once its ranks are gone: its local rank 0 may
        # rewrite it until then (slurmtools.train.end_ranks)
        (in_place.control_dir / HEARTBEAT_DIR / node_file_name(node)).unlink(missing_ok=True)
        actions.drain_node(job_id, in_place.attempt_id, node, replace(diagnosis, node=node),
                           direct=this_run.direct_drain)
    this_run.lost.extend(lost)
    node_watch.swap(lost, found.spares_used, now)
    ledger.append(in_place.control_dir, ledger.InPlaceRecovery(
        in_place.attempt_id, now, found.generation, ",".join(lost), ",".join(found.spares_used), diagnosis.detail,
        newest_step, cause=diagnosis.cause.value))


def on_crash(in_place: InPlace, failures: Sequence[inplace_plan.TaskFailure], limits: RequeueSpec,
             manager: Optional[CheckpointManager], tail: str) -> Optional[str]:
    """Ranks that failed on live nodes: started again where they ran, into the next generation,
    while every other rank keeps its process (None), when the budget allows a crash's restart;
    else why not, said, for the relaunch."""
    control, attempt_id = in_place.control_dir, in_place.attempt_id
    events = ledger.read(control)
    progress = ledger.attempt_progress_of(events, attempt_id, _newest_step(manager))
    faulty = [node for node, _ in gpu_events.node_faults(gpu_events.read_events(control, attempt_id))]
    now = time.time()
    verdict = in_place.forming() or inplace_plan.crash_verdict(failures, tail + "\n" + in_place.evidence(), faulty,
                                                                ledger.history(events), limits, progress, now)
    found = in_place.restart(failures) if isinstance(verdict, policy.Diagnosis) else verdict
    nodes = sorted({failure.node for failure in failures})
    if isinstance(found, str):
        emit("in_place_refused", attempt_id, nodes=nodes, reason=found)
        return found
    assert isinstance(verdict, policy.Diagnosis)
    emit("in_place", attempt_id, generation=found.generation, lost=nodes, spares=nodes, warm=in_place.warm,
         ranks=[[r.first_rank, r.ranks] for r in found.replacements], cause=policy.Cause.CRASH.value,
         detail=verdict.detail)
    ledger.append(control, ledger.InPlaceRecovery(attempt_id, now, found.generation, ",".join(nodes),
                                                  ",".join(nodes), verdict.detail, progress,
                                                  cause=policy.Cause.CRASH.value))
    return None


def task_failed(in_place: InPlace, node_watch: nodecheck.NodeWatch,
                on_crashed: Callable[[List[inplace_plan.TaskFailure]], Optional[str]]
                ) -> "Optional[nodecheck.Death | str]":
    """A loss heard of at once: srun's line for a failed task (its node's slurmd asked), or a node's
    word that its ranks' group broke (every node of the step asked), each slurmd twice, 2 s apart. A
    node that does not answer is dead (the in-place path, no node timeout waited for); tasks that
    failed on a live node are a crash, given to on_crashed (None: restarted in place); a broken
    group behind which srun names no failed task within FAILED_TASK_WAIT_S is a rank lost for the
    relaunch. What cannot be recovered in place is said (the step cannot go on without it)."""
    failures = [failure for failure in in_place.failures() if failure.node in in_place.placement]
    suspects = {failure.node for failure in failures}
    reports = generation.broken_reports(in_place.control_dir, in_place.generation)
    if reports > in_place.broken_seen:
        in_place.broken_seen = reports
        suspects |= set(node_watch.candidates)
        if in_place.report_heard_at is None:
            in_place.report_heard_at = time.monotonic()
    dead = node_watch.unreachable(sorted(suspects)) if suspects else []
    if dead:
        in_place.report_heard_at = None
        in_place.put_back([failure for failure in failures if failure.node not in dead])   # heard next
        return nodecheck.Death(tuple(dead), 0.0, 0.0)
    if failures:
        in_place.report_heard_at = None
        why_not = on_crashed(failures)
        if why_not is None:
            return None
        return f"a rank was lost on a live node (every slurmd of {','.join(sorted(suspects))} answers): {why_not}"
    if in_place.report_heard_at is not None and time.monotonic() - in_place.report_heard_at > FAILED_TASK_WAIT_S:
        in_place.report_heard_at = None
        return (f"a rank's group broke, every slurmd answers and srun named no failed task within "
                f"{FAILED_TASK_WAIT_S:g} s")
    return None
