"""The root side of a blame: every health run (prolog, epilog, HealthCheckProgram) with a blame
spool claims the waiting reports, has munged verify each one's user, asks Slurm whose job it is
and where it ran, decides (model.decide) and drains with a structured reason
(`slurmtools: CRITICAL <check> <evidence> user=<u> job=<j>`, e.g. job.hang, preflight.canary). A node already drained -- by a
person or by us -- is left exactly as it is. Every report gets a record in done/ and one line."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from slurmtools.blame import model, munge, spool
from slurmtools.blame.config import BlameSettings
from slurmtools.errors import SlurmCommandError, one_line
from slurmtools.slurm import drain, commands as slurm
from slurmtools.slurm.parse import hostlist_size


@dataclass(frozen=True)
class Handled:
    name: str
    action: str               # drain | drained-already | record | refuse
    why: str
    node: Optional[str] = None
    job: Optional[str] = None

    def line(self) -> str:
        about = f" job {self.job} blamed {self.node}:" if self.job else ":"
        return one_line(f"slurmtools: blame {self.name}{about} {self.action} ({self.why})")


# a job's node list root expands at most (a hostlist says 10**8 nodes in 14 characters)
MAX_JOB_NODES = 100_000


def _expand(hostlist: str) -> List[str]:
    """The job's nodes; none when the list is unreadable or longer than MAX_JOB_NODES."""
    from ClusterShell.NodeSet import NodeSet, NodeSetParseError
    size = hostlist_size(hostlist) if hostlist and hostlist != "(null)" else 0
    if not size or size > MAX_JOB_NODES:
        return []
    try:
        return list(NodeSet(hostlist))
    except NodeSetParseError:
        return []


def handle(settings: BlameSettings, *, now_s: Optional[float] = None, until: Optional[float] = None
           ) -> List[Handled]:
    """Claim and handle every waiting report; [] when blames are off or none wait. until (a
    time.monotonic() deadline): no report is claimed past it; those left wait for the next run."""
    if not settings.spool_dir:
        return []
    spool_dir = Path(settings.spool_dir)
    done = spool.check_spool(spool_dir)
    if not spool.waiting(spool_dir):
        return []
    # every node's hooks handle blames; one at a time, so each decision sees every earlier one
    # (three nodes at once each drained one node of a job whose budget was two)
    with spool.handling_lock(done) as mine:
        return _handle_waiting(settings, spool_dir, done, now_s, until) if mine else []


def _handle_waiting(settings: BlameSettings, spool_dir: Path, done: Path, now_s: Optional[float],
                    until: Optional[float] = None) -> List[Handled]:
    # what every report needs, asked before any is claimed: a failure here leaves them waiting
    now_s = time.time() if now_s is None else now_s
    earlier = model.accepted_from(spool.records(done, now_s))
    cluster = slurm.cluster_name()
    out = [Handled(f"quota of uid {uid}", "refuse", f"{count} reports past the {spool.MAX_WAITING_PER_USER} a user may "
                                                     f"have waiting, removed unread")
           for uid, count in sorted(spool.remove_over_quota(spool_dir).items())]
    reports = spool.claim(spool_dir)
    while until is None or time.monotonic() < until:
        try:
            name, raw = next(reports)
        except StopIteration:
            break
        try:
            result, entry = _one(name, raw, settings, cluster, earlier, now_s)
        except Exception as exc:   # our own failure: the report is recorded as refused, never lost silently
            result, entry = Handled(name, "refuse", one_line(f"slurmtools failed: {type(exc).__name__}: {exc}")), {}
        spool.record(done, name, {**entry, "name": name, "action": result.action, "why": result.why,
                                  "time_s": now_s, "handled_s": now_s})
        spool.forget(done, name)
        if entry.get("accepted"):
            earlier.append(model.Accepted(entry["job"], entry["node"], entry["kind"], now_s, entry["uid"],
                                          result.action == "drain"))
        out.append(result)
    return out


def _one(name: str, raw: Optional[bytes], settings: BlameSettings, cluster: str,
         earlier: List[model.Accepted], now_s: float) -> Tuple[Handled, Dict[str, Any]]:
    if raw is None:
        return Handled(name, "refuse", "not a regular file of at most "
                                       f"{spool.MAX_REPORT_BYTES} bytes (a link, a FIFO, too large)"), {}
    try:
        decoded = munge.decode(raw.decode("ascii", errors="replace").strip(), settings.munge_socket)
    except munge.MungeError as exc:
        return Handled(name, "refuse", str(exc)), {}
    blame, problem = model.parse_payload(decoded.payload)
    if blame is None:
        return Handled(name, "refuse", f"{problem} (from uid {decoded.uid})"), {"uid": decoded.uid}
    entry: Dict[str, Any] = {"job": blame.job, "node": blame.node, "kind": blame.kind, "check": blame.check,
                             "uid": decoded.uid,
                                "user": decoded.user, "evidence": blame.evidence}
    try:
        # a run that ended before the reports' age bound names no nodes (a reused job id's old run)
        owner = slurm.job_owner(int(blame.job), now_s - settings.rules().report_max_age_h * 3600)
    except SlurmCommandError as exc:
        return Handled(name, "refuse", f"Slurm could not be asked about job {blame.job}: {exc}", blame.node,
                       blame.job), entry
    found = model.Verified(blame, decoded.uid, decoded.user, owner[0] if owner else None,
                           _expand(owner[1]) if owner else [], owner[2] if owner else None)
    decision = model.decide(found, cluster, earlier, settings.rules(), now_s)
    entry["accepted"] = decision.action in ("drain", "record")     # evidence that counts from now on
    if decision.action != "drain":
        return Handled(name, decision.action, decision.why, blame.node, blame.job), entry
    reason = drain.DrainReason("CRITICAL", blame.check, decision.reason_detail, blame.job, decoded.user)
    try:
        drained = drain.drain(blame.node, reason)
    except SlurmCommandError as exc:
        return Handled(name, "refuse", f"the drain failed: {exc}", blame.node, blame.job), entry
    entry["reason"] = reason.render()
    action = "drain" if drained else "drained-already"
    why = decision.why if drained else f"{decision.why}; the node was drained already and is left as it is"
    return Handled(name, action, why, blame.node, blame.job), entry
