"""Carrying out a verdict: drain a blamed node, restart in the allocation without it, or
requeue the job (excluding it); and the JSON event lines every step of that writes."""
from __future__ import annotations

import json
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Set

from slurmtools.common.one_write import say, write_line
from slurmtools.common.signals import SignalFlags
from slurmtools.errors import SlurmCommandError
from slurmtools.requeue import policy, step
from slurmtools.requeue.topology import Topology
from slurmtools.slurm import drain, commands as slurm


@dataclass
class Run:
    """This run of the batch script: its allocation and the nodes it lost so far."""

    topology: Topology
    lost: List[str] = field(default_factory=list)
    given_back: List[str] = field(default_factory=list)   # the dead ones among lost (policy.slurm_removal_aftermath)
    direct_drain: bool = False               # drain with the job's rights (RequeueSpec.direct_drain)
    # nodes whose exclusions by this job ran out (exclusions.expired): they leave ExcNodeList
    expired_exclusions: FrozenSet[str] = frozenset()
    # steps open when a node of theirs died: they stay in Slurm's books (step.wait_steps_ended)
    stuck_steps: Set[str] = field(default_factory=set)


def emit(event: str, attempt_id: str, **fields: object) -> None:
    """One JSON line on stdout (the job's output file) per supervisor event, in one write: the steps'
    output pumps write the ranks' lines to the same stream from their threads (one_write)."""
    line = json.dumps({"slurmtools": event, "attempt_id": attempt_id, "t": round(time.time(), 3), **fields},
                      sort_keys=True, default=str)
    write_line(sys.stdout, line)


def drain_node(job_id: Optional[int], attempt_id: str, node: str, diag: policy.Diagnosis, *,
               direct: bool = False) -> None:
    """Take a blamed node out of service. A job runs as its user, who may not drain: the blame is
    reported with its evidence to the site's root-owned health hooks (slurmtools.blame), which
    check it and drain. direct: drain with the job's own rights (a site whose users are operators)."""
    check = diag.check or f"job.{diag.cause.value}"
    if not direct:
        if job_id is None:
            return                                   # outside Slurm: no job to blame for
        from slurmtools.blame.report import BlameError, report
        from slurmtools.errors import ConfigError
        from slurmtools.health.config import load_config, this_host
        try:
            settings = load_config().for_host(this_host()).blame     # the site's, beside slurm.conf
            path = report(job_id, node, check, diag.detail, settings)
            emit("blame", attempt_id, node=node, check=check, evidence=diag.detail, report=str(path))
        except ConfigError as exc:
            emit("blame_failed", attempt_id, node=node, error=f"the site's blame settings cannot be read: {exc}")
        except BlameError as exc:
            emit("blame_failed", attempt_id, node=node, error=str(exc))
        return
    reason = drain.DrainReason("CRITICAL", check, diag.detail, str(job_id))
    try:
        drained = drain.drain(node, reason)
        emit("drain", attempt_id, node=node, reason=reason.render(), applied=drained)
    except SlurmCommandError as exc:
        emit("drain_failed", attempt_id, node=node, error=str(exc))


def restart_in_allocation(job_id: Optional[int], attempt_id: str, this_run: Run, diag: policy.Diagnosis, verdict: policy.Verdict,
                      flags: SignalFlags) -> bool:
    """Drain a blamed node and leave it out of the next steps, wait the backoff; False when
    Slurm began ending the run meanwhile (the caller requeues instead).

    A dead node is given back (the job shrunk by it, give_back). A step that counted it stays
    open in Slurm's books, holding its live nodes' CPUs, whatever is cancelled (measured on
    22.05); so the next steps run with --overlap."""
    node = verdict.exclude_node
    if node is not None and job_id is not None:
        for blamed in verdict.drained:
            drain_node(job_id, attempt_id, blamed, diag, direct=this_run.direct_drain)
        this_run.lost.extend(verdict.excluded)
        killed, errors = step.kill_steps(job_id)
        for error in errors:
            emit("step_kill_failed", attempt_id, error=error)
        if diag.cause is policy.Cause.NODE_FAILURE:
            this_run.stuck_steps.update(killed)
            give_back(job_id, attempt_id, list(verdict.excluded))
            this_run.given_back.extend(verdict.excluded)
        emit("replace_node", attempt_id, node=node, also=list(verdict.also_nodes),
             spares_left=this_run.topology.spares(this_run.lost), nodes=this_run.topology.pick(this_run.lost))
    deadline = time.time() + verdict.backoff_s
    while time.time() < deadline and not flags.seen(signal.SIGTERM):
        time.sleep(0.1)
    if flags.seen(signal.SIGTERM):
        return False
    emit("restart", attempt_id, backoff_s=verdict.backoff_s, in_allocation=True)
    return True


def give_back(job_id: int, attempt_id: str, dead: List[str]) -> None:
    """Shrink the job by its dead nodes before the next step starts. Slurm removes a dead node from
    a --no-kill job itself once it marks it DOWN (SlurmdTimeout after the death, 300 s by default),
    at a moment of its own; when that fell on the next step's launch, the launch failed across the
    step (the 128-node test: "Task launch ... failed: Communication connection failure", twice in a
    row). Given back first, the node is no longer the job's when Slurm marks it down. A refused
    shrink leaves things as before (Slurm's own removal, later)."""
    try:
        left = slurm.give_back_nodes(job_id, dead)
        emit("give_back", attempt_id, nodes=dead, applied=left is not None)
    except SlurmCommandError as exc:
        emit("give_back_failed", attempt_id, nodes=dead, error=str(exc))


def requeue(job_id: int, attempt_id: str, diag: policy.Diagnosis, verdict: policy.Verdict,
             flags: SignalFlags, this_run: Run) -> int:
    """Requeue ourselves; with an exclusion or a backoff: requeue, then update while the job
    completes (slurm.requeue_excluding)."""
    for blamed in verdict.drained:
        drain_node(job_id, attempt_id, blamed, diag, direct=this_run.direct_drain)
    if flags.seen(signal.SIGTERM):
        # Slurm is already ending this run (its own requeue, node failure or preemption).
        emit("requeue", attempt_id, by="slurm")
        return 0
    try:
        if verdict.exclude_node or verdict.backoff_s > 0 or this_run.lost:
            fields = requeue_fields(job_id, verdict, this_run)
            slurm.requeue_excluding(job_id, fields)
            emit("requeue", attempt_id, by="slurmtools", **{key.lower(): value for key, value in fields.items()})
        else:
            slurm.requeue(job_id)
            emit("requeue", attempt_id, by="slurmtools")
    except SlurmCommandError as exc:
        say(f"slurmtools: requeue of job {job_id} failed: {exc}")
        return 1
    return _ended_by_slurm(flags)


def cancel_own_job(job_id: int, attempt_id: str) -> None:
    """A graceful cancel's end, once the ranks checkpointed and stopped: the job cancelled, as a
    person's scancel ends it (CANCELLED in sacct, no requeue); a refused cancel leaves the job to
    end with the batch script (COMPLETED)."""
    try:
        slurm.cancel(job_id)
        emit("cancelled", attempt_id, by="slurmtools")
    except SlurmCommandError as exc:
        emit("cancel_failed", attempt_id, error=str(exc))


def regrow(job_id: int, attempt_id: str, job_nodes: int, flags: SignalFlags) -> int:
    """Slurm requeued this job as it last was, shrunk by the dead nodes it gave back, and the
    allocation cannot hold its training nodes: requeue it asking its full node count again. Not a
    failure: no attempt is recorded or counted."""
    emit("regrow", attempt_id, nodes=job_nodes)
    try:
        slurm.requeue_excluding(job_id, {"NumNodes": str(job_nodes)})
    except SlurmCommandError as exc:
        say(f"slurmtools: requeue of job {job_id} for its {job_nodes} nodes failed: {exc}")
        return 1
    return _ended_by_slurm(flags)


def _ended_by_slurm(flags: SignalFlags) -> int:
    """Slurm now ends this run; wait to be terminated rather than racing it with an exit code."""
    deadline = time.time() + 60
    while time.time() < deadline and not flags.seen(signal.SIGTERM):
        time.sleep(0.2)
    return 0


def requeue_fields(job_id: int, verdict: policy.Verdict, this_run: Run) -> Dict[str, str]:
    """ExcNodeList (the blamed and lost nodes added to what is already excluded, less the nodes
    whose exclusions by this job ran out), NumNodes (the allocation's size again, when nodes were
    given back) and StartTime (backoff)."""
    fields: Dict[str, str] = {}
    blamed = [*verdict.excluded, *this_run.lost]
    if blamed:
        from ClusterShell.NodeSet import NodeSet
        # the requeue that follows rides a controller outage (REQUEUE_OUTAGE_S): so does this read
        excluded = (slurm.show_job(job_id, survive_sigterm=True, outage_s=slurm.REQUEUE_OUTAGE_S) or {}).get(
            "ExcNodeList", "(null)")
        nodeset = NodeSet(",".join(blamed))
        if excluded not in ("", "(null)"):
            kept = NodeSet(excluded)
            if this_run.expired_exclusions:
                kept.difference_update(",".join(sorted(this_run.expired_exclusions)))
            nodeset.update(kept)
        fields["ExcNodeList"] = str(nodeset)
    if this_run.lost and this_run.topology.allocation:
        fields["NumNodes"] = str(len(this_run.topology.allocation))
    if verdict.backoff_s > 0:
        fields["StartTime"] = f"now+{int(round(verdict.backoff_s))}"
    return fields
