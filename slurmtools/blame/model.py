"""A job's blame of a node, and the root side's decision on it (pure: no I/O, no clock).

Jobs run as their users, and Slurm lets only operators drain. So a job's supervisor does not
drain: it *reports* the node it blames, with its evidence, as a munge credential (the user's
identity, authenticated by munged) dropped into the site's blame spool. A root-owned part -- the
health hooks (`slurmtools health run`: prolog, epilog, HealthCheckProgram) -- reads the spool,
checks that the job belongs to the credential's user and ran on the node, and decides here:

- a kind of evidence the admin set to `drain` (default: node death, a fatal XID, wrong results in
  the SDC or preflight canary) drains the node at once;
- a kind set to `confirm` (default: a straggler, a hang's attribution) drains only once
  `confirm_jobs` distinct jobs blamed the node within `confirm_window_h`;
- a job that blamed more than `max_nodes_per_job_per_day` distinct nodes is itself the suspect:
  nothing more is drained for it (one line says so);
- a node already drained (by a person or by us) stays exactly as it is (drain.drain).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from slurmtools.common.fsutil import json_object

# The kinds of evidence a job may report, each with its default: drain at once, or confirm first.
# (The requeue policy's causes map onto them in KIND_OF_CAUSE.)
DEFAULT_ACTIONS: Dict[str, str] = {
    "node_death": "drain", "xid": "drain", "sdc": "drain", "preflight": "drain",
    "straggler": "confirm", "hang": "confirm",
}
ACTIONS = ("drain", "confirm", "ignore")
KIND_OF_CAUSE: Dict[str, str] = {
    "node_failure": "node_death", "gpu_fatal": "xid", "sdc": "sdc", "preflight": "preflight",
    "straggler": "straggler", "hang": "hang", "collective_timeout": "hang",
}
MAX_EVIDENCE_CHARS = 160
MAX_PAYLOAD_BYTES = 4096
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_JOB = re.compile(r"^[0-9]{1,12}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CHECK = re.compile(r"^(job|preflight)\.[a-z_]{1,40}$")


def kind_of_check(check: str) -> Optional[str]:
    """The kind of evidence a check name stands for (job.node_failure -> node_death, job.hang ->
    hang, preflight.canary -> preflight); None for a name that is none of them."""
    if not _CHECK.match(check):
        return None
    family, name = check.split(".", 1)
    return "preflight" if family == "preflight" else KIND_OF_CAUSE.get(name)


@dataclass(frozen=True)
class Blame:
    """What a job's supervisor reports: its cluster and job, the node, the check that blamed it (its
    kind follows from it) and the measured evidence."""
    cluster: str
    job: str
    node: str
    check: str
    evidence: str
    time_s: float

    @property
    def kind(self) -> str:
        return kind_of_check(self.check) or ""

    def payload(self) -> str:
        return json.dumps({"cluster": self.cluster, "job": self.job, "node": self.node, "check": self.check,
                           "evidence": self.evidence, "time_s": round(self.time_s, 3)}, sort_keys=True)


def clean_evidence(text: str) -> str:
    """Evidence as one short line: control characters removed, whitespace folded, length capped."""
    return " ".join(_CONTROL.sub(" ", text).split())[:MAX_EVIDENCE_CHARS]


def parse_payload(text: str) -> Tuple[Optional[Blame], str]:
    """(the blame, "") or (None, why it is refused): every field checked, nothing trusted."""
    if len(text.encode(errors="replace")) > MAX_PAYLOAD_BYTES:
        return None, f"payload larger than {MAX_PAYLOAD_BYTES} bytes"
    data = json_object(text.strip())
    if data is None:
        return None, "payload is not a JSON object"
    strings = {key: data.get(key) for key in ("cluster", "job", "node", "check", "evidence")}
    missing = [key for key, value in strings.items() if not isinstance(value, str)]
    if missing:
        return None, f"payload lacks {', '.join(missing)}"
    time_s = data.get("time_s")
    if isinstance(time_s, bool) or not isinstance(time_s, (int, float)):
        return None, "payload lacks time_s"
    if not _JOB.match(str(strings["job"])):
        return None, f"job {str(strings['job'])[:20]!r} is not a job id"
    for key in ("cluster", "node"):
        if not _NAME.match(str(strings[key])):
            return None, f"{key} {str(strings[key])[:20]!r} is not a name"
    if kind_of_check(str(strings["check"])) is None:
        return None, f"no kind of evidence for check {str(strings['check'])[:48]!r}"
    # one spelling per job: "017" and "17" are the same job to Slurm, so to every budget here
    return Blame(str(strings["cluster"]), job_id_text(str(strings["job"])), str(strings["node"]),
                 str(strings["check"]), clean_evidence(str(strings["evidence"])), float(time_s)), ""


def job_id_text(job: str) -> str:
    """A job id as Slurm writes it (no leading zeros); text that is no job id stays as it is."""
    return str(int(job)) if _JOB.match(job) else job


@dataclass(frozen=True)
class Verified:
    """A blame whose credential munged verified, with the facts Slurm gave about its job."""
    blame: Blame
    uid: int                                # from the credential: who reported it
    user: str
    job_uid: Optional[int]                  # Slurm's owner of the job (None: Slurm does not know it)
    job_nodes: Sequence[str]                # every node the job was given
    job_ended_s: Optional[float] = None     # when its last run ended (None: running, or Slurm still knows it)


@dataclass(frozen=True)
class Accepted:
    """An earlier blame the root side accepted (its record in the spool's done/)."""
    job: str
    node: str
    kind: str
    time_s: float
    uid: Optional[int] = None          # who reported it (munged's word); None in records of before
    drained: bool = False              # it drained the node (else it was recorded as evidence)


@dataclass(frozen=True)
class BlameRules:
    """The admin's settings (health config, `blame:`)."""
    actions: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_ACTIONS))
    max_nodes_per_job_per_day: int = 2
    confirm_jobs: int = 2
    confirm_window_h: float = 24.0
    max_nodes_per_user_per_day: int = 4       # every job of one user together (array tasks, held jobs)
    max_drains_per_hour: int = 8              # the whole cluster: past it a person should look
    report_max_age_h: float = 24.0            # a report written longer ago (or in the future) is stale


@dataclass(frozen=True)
class Decision:
    action: str                  # "drain", "record" (kept as evidence, nothing drained), "refuse"
    why: str
    reason_detail: str = ""      # what the drain reason says after the check's name (then user=, job=)


def decide(found: Verified, cluster: str, earlier: Sequence[Accepted], rules: BlameRules,
           now_s: float) -> Decision:
    """What to do with one verified blame, given the blames accepted before it."""
    blame = found.blame
    if blame.cluster != cluster:
        return Decision("refuse", f"job {blame.job} is of cluster {blame.cluster!r}, not {cluster!r}")
    if found.job_uid is None:
        return Decision("refuse", f"Slurm knows no job {blame.job}")
    if found.job_uid != found.uid:
        return Decision("refuse", f"job {blame.job} is not a job of uid {found.uid}")
    if blame.node not in found.job_nodes:
        return Decision("refuse", f"node {blame.node} was not given to job {blame.job}")
    if not -FUTURE_TOLERANCE_S <= now_s - blame.time_s <= rules.report_max_age_h * 3600:
        return Decision("refuse", f"the report's time is {(now_s - blame.time_s) / 3600:.1f} h ago (at most "
                                  f"{rules.report_max_age_h:g} h, none in the future)")
    if found.job_ended_s is not None and now_s - found.job_ended_s > rules.report_max_age_h * 3600:
        return Decision("refuse", f"job {blame.job} ended {(now_s - found.job_ended_s) / 3600:.1f} h ago (at most "
                                  f"{rules.report_max_age_h:g} h)")
    action = rules.actions.get(blame.kind, DEFAULT_ACTIONS[blame.kind])
    if action == "ignore":
        return Decision("record", f"blames of kind {blame.kind} are ignored here")
    over = over_budget(found, earlier, rules, now_s)
    if over:
        return Decision("refuse", over)
    detail = blame.evidence
    # evidence that drained the node once has served (a person who resumed it, found nothing, is
    # not overruled by the same old reports): when the node was last drained by a blame
    # (Accepted.time_s: when that drain was handled)
    last_drain_s = max((a.time_s for a in earlier if a.node == blame.node and a.drained), default=None)
    if action == "drain":
        # a report written before that drain (another rank's copy of the same event) is kept only
        if last_drain_s is not None and last_drain_s >= blame.time_s:
            return Decision("record", f"{blame.node} was drained by a blame after this report was written "
                                      f"({(now_s - last_drain_s) / 3600:.1f} h ago): it has served")
        return Decision("drain", f"{blame.kind} drains at once", detail)
    window_s = rules.confirm_window_h * 3600
    # a confirm kind counts reports handled since that drain only
    since_s = last_drain_s if last_drain_s is not None else now_s - window_s
    alike = [a for a in earlier if a.node == blame.node and a.kind == blame.kind
             and now_s - a.time_s <= window_s and a.time_s > since_s]
    jobs = {a.job for a in alike} | {blame.job}
    # one user's jobs confirm nothing: each must be another user's (a record of before has no uid)
    users = {a.uid if a.uid is not None else f"job {a.job}" for a in alike} | {found.uid}
    if len(jobs) >= rules.confirm_jobs and len(users) >= rules.confirm_jobs:
        return Decision("drain", f"{len(jobs)} jobs blamed {blame.node} for {blame.kind} within "
                                 f"{rules.confirm_window_h:g} h", f"{detail} jobs={len(jobs)}")
    return Decision("record", f"{blame.kind} needs {rules.confirm_jobs} jobs of as many users within "
                              f"{rules.confirm_window_h:g} h to drain; {min(len(jobs), len(users))} so far")


FUTURE_TOLERANCE_S = 300.0        # clock skew between the job's node and the one handling its report


def over_budget(found: Verified, earlier: Sequence[Accepted], rules: BlameRules, now_s: float) -> str:
    """Why a blame is past a budget (the job's or its user's distinct nodes in a day, the cluster's
    drains in an hour), or ""."""
    blame = found.blame
    day = [a for a in earlier if now_s - a.time_s <= 24 * 3600]
    nodes_of_job = {a.node for a in day if a.job == blame.job} | {blame.node}
    if len(nodes_of_job) > rules.max_nodes_per_job_per_day:
        return (f"job {blame.job} blamed {len(nodes_of_job)} nodes within a day (at most "
                f"{rules.max_nodes_per_job_per_day}): the job is the suspect, not the nodes")
    nodes_of_user = {a.node for a in day if a.uid == found.uid} | {blame.node}
    if len(nodes_of_user) > rules.max_nodes_per_user_per_day:
        return (f"the jobs of uid {found.uid} blamed {len(nodes_of_user)} nodes within a day (at most "
                f"{rules.max_nodes_per_user_per_day}): the user's jobs are the suspects, not the nodes")
    hour = {a.node for a in earlier if a.drained and now_s - a.time_s <= 3600} - {blame.node}
    if len(hour) >= rules.max_drains_per_hour:
        return (f"{len(hour)} nodes were drained by blames within the hour (at most {rules.max_drains_per_hour} "
                f"for the cluster): a person should look before more go")
    return ""


def accepted_from(records: Sequence[Mapping[str, Any]]) -> List[Accepted]:
    """The done/ records (written by the root side itself) as Accepted; others are skipped."""
    out = []
    for record in records:
        values = [record.get(key) for key in ("job", "node", "kind")]
        time_s = record.get("time_s")
        uid = record.get("uid")
        if all(isinstance(v, str) for v in values) and isinstance(time_s, (int, float)) and record.get("accepted"):
            out.append(Accepted(job_id_text(str(values[0])), str(values[1]), str(values[2]), float(time_s),
                                uid if type(uid) is int else None, record.get("action") == "drain"))
    return out
