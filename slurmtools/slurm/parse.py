"""What Slurm's commands print, parsed (pure): `scontrol -o show` records and the JSON of the
three releases we run on.

The JSON shapes differ by release, and every parser here accepts all three:
- 22.05 (`squeue/sinfo/sacct --json`, data_parser before v0.0.39): a state is a string
  (`"job_state": "RUNNING"`, node `"state": "idle"` plus `"state_flags": ["DRAIN"]`), a number
  is a plain integer, sacct's `"state": {"current": "COMPLETED"}`, `"exit_code": {"return_code": 0}`.
- 24.11 (v0.0.40+) and 26.05: a state is a list of flags (`"job_state": ["RUNNING"]`, node
  `"state": ["IDLE", "DRAIN"]`), a number is `{"set": true, "infinite": false, "number": 0}`,
  sacct's `"state": {"current": ["COMPLETED"]}`, an exit code's signal `{"id": {"number": 9}}`.
  `scontrol show job|node --json` exists here (not in 22.05, whose scontrol has no --json).
Unit tests hold each release's recorded output (tests/unit/slurm_outputs/, written by
scripts/record_slurm_outputs.py on the mini-cluster).
"""
from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from slurmtools.errors import SlurmCommandError

# Job states in which a job will not change any more.
TERMINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE", "PREEMPTED", "REVOKED", "SPECIAL_EXIT",
})
# A node's base states; every other word of its state is a flag (DRAIN, NOT_RESPONDING, ...).
NODE_BASE_STATES = frozenset({"IDLE", "ALLOCATED", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN"})
# The first release whose scontrol has --json (scontrol show job|node --json).
SCONTROL_JSON_SINCE = (23, 2)
# The first release whose sbatch takes --requeue=expedite (slurmctld: enable_expedited_requeue).
EXPEDITE_SINCE = (25, 11)
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.\d+)?")


def version_tuple(text: str) -> Optional[Tuple[int, int]]:
    """The first MAJOR.MINOR[.MICRO] in text ('slurm-wlm 24.11.5', '22.05.8-4+deb12u1') -> (24, 11)."""
    match = _VERSION.search(text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def parse_release(version_text: str) -> Tuple[int, int]:
    """`slurm 22.05.8` / `slurm-wlm 24.11.5` (scontrol --version) -> (22, 5)."""
    found = version_tuple(version_text)
    if found is None:
        raise SlurmCommandError(["scontrol", "--version"], 0, f"unexpected output: {version_text.strip()[:80]!r}")
    return found


def parse_scontrol_record(line: str) -> Dict[str, str]:
    """Parse one `scontrol -o show` line into a dict.

    Values may contain spaces (Reason=..., Command=...): a token that does not start
    a new `Key=` belongs to the previous value.
    """
    record: Dict[str, str] = {}
    key: Optional[str] = None
    for token in line.strip().split(" "):
        match = re.match(r"^([A-Za-z][A-Za-z0-9_:/]*)=(.*)$", token)
        if match and (key is None or match.group(1)[0].isupper()):
            key = match.group(1)
            record[key] = match.group(2)
        elif key is not None:
            record[key] += " " + token
    return record


def parse_job_id(sbatch_stdout: str) -> int:
    """`sbatch --parsable` prints `ID` or `ID;cluster`."""
    text = sbatch_stdout.strip().split(";")[0]
    if not text.isdigit():
        raise SlurmCommandError(["sbatch", "--parsable"], 0, f"unexpected output: {sbatch_stdout.strip()!r}")
    return int(text)


# ---- JSON values of every release ------------------------------------------------
def json_number(value: Any) -> Optional[int]:
    """22.05's plain integer or 24.11+'s {"set", "infinite", "number"} (None: unset or infinite)."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def json_states(value: Any) -> List[str]:
    """A state as a list of upper-case words: "RUNNING", ["RUNNING"], {"current": [...]}, "IDLE+DRAIN"."""
    if isinstance(value, dict):
        value = value.get("current", [])
    if isinstance(value, str):
        value = value.split("+")
    if not isinstance(value, list):
        return []
    return [str(word).upper() for word in value if str(word)]


def _local_time(epoch: Optional[int]) -> str:
    """An epoch as scontrol prints times (local, to the second); "" for none."""
    if not epoch:
        return ""
    return datetime.datetime.fromtimestamp(epoch).isoformat(timespec="seconds")


# ---- nodes -----------------------------------------------------------------------
@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str                 # base state, lower case: idle, allocated, mixed, down, ...
    flags: Tuple[str, ...]     # DRAIN, NOT_RESPONDING, ...
    reason: str
    reason_user: str
    reason_time: str
    gres: str

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def display_state(self) -> str:
        """A sinfo-like word: idle, alloc, drained, draining, down*, ..."""
        base = self.state
        if self.drained:
            base = "draining" if self.state in ("allocated", "mixed") else "drained"
        return base + ("*" if "NOT_RESPONDING" in self.flags else "")


def _strip_reason_suffix(reason: str) -> str:
    # scontrol appends " [user@time]" to the reason.
    return re.sub(r"\s*\[[^\[\]]*@[^\[\]]*\]$", "", reason)


def split_node_state(words: List[str]) -> Tuple[str, Tuple[str, ...]]:
    """(base state in lower case, the other words as flags); the base is the first base-state word."""
    base = next((word for word in words if word in NODE_BASE_STATES), words[0] if words else "UNKNOWN")
    flags = [word for word in words if word != base]
    return base.lower(), tuple(flags)


def parse_node_record(record: Mapping[str, str]) -> NodeInfo:
    state, flags = split_node_state(json_states(record.get("State", "UNKNOWN")))
    reason = record.get("Reason", "")
    match = re.search(r"\[([^@\[\]]*)@([^\[\]]*)\]$", reason)
    return NodeInfo(
        name=record.get("NodeName", ""),
        state=state,
        flags=flags,
        reason="" if reason in ("", "(null)") else _strip_reason_suffix(reason),
        reason_user=match.group(1) if match else "",
        reason_time=match.group(2) if match else "",
        gres=record.get("Gres", ""),
    )


def parse_node_json(node: Mapping[str, Any]) -> NodeInfo:
    """One node of `scontrol show node --json` (24.11+) or `sinfo --json` (22.05)."""
    words = json_states(node.get("state", "UNKNOWN")) + json_states(node.get("state_flags", []))
    state, flags = split_node_state(words)
    return NodeInfo(name=str(node.get("name", "")), state=state, flags=flags,
                    reason=str(node.get("reason") or ""), reason_user=str(node.get("reason_set_by_user") or ""),
                    reason_time=_local_time(json_number(node.get("reason_changed_at"))),
                    gres=str(node.get("gres") or ""))


def parse_nodes_json(text: str) -> List[NodeInfo]:
    data = json.loads(text)
    return [parse_node_json(node) for node in data.get("nodes", [])]


# ---- jobs ------------------------------------------------------------------------
@dataclass(frozen=True)
class JobInfo:
    job_id: int
    state: str
    reason: str = ""
    nodes: str = ""
    exit_code: str = ""
    restarts: int = 0
    stdout: str = ""           # the batch script's standard output file ("" unknown)
    raw: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES


def parse_job_record(record: Mapping[str, str], job_id: int) -> JobInfo:
    """One `scontrol -o show job` record (a few hundred bytes, this job only) as a JobInfo."""
    state = record.get("JobState", "UNKNOWN").split("+")[0].upper() or "UNKNOWN"
    nodes = record.get("NodeList", "")
    restarts = record.get("Restarts", "0")
    return JobInfo(job_id=job_id, state=state, reason=record.get("Reason", ""),
                   nodes="" if nodes in ("(null)", "None") else nodes, exit_code=record.get("ExitCode", ""),
                   restarts=int(restarts) if restarts.isdigit() else 0, stdout=record.get("StdOut", ""),
                   raw=dict(record))


def exit_code_text(value: Any) -> str:
    """`return_code:signal` as scontrol prints ExitCode, from any release's exit_code."""
    if isinstance(value, dict):
        code = json_number(value.get("return_code"))
        signal = value.get("signal", {}) or {}
        sig = json_number(signal.get("id", signal.get("signal_id"))) if isinstance(signal, dict) else None
        return f"{code if code is not None else ''}:{sig or 0}"
    code = json_number(value)
    return f"{code}:0" if code is not None else ""


def parse_job_json(job: Mapping[str, Any]) -> JobInfo:
    """One job of `scontrol show job --json` (24.11+) or `squeue --json` (22.05)."""
    states = json_states(job.get("job_state", "UNKNOWN"))
    nodes = str(job.get("nodes") or "")
    return JobInfo(job_id=json_number(job.get("job_id")) or 0, state=states[0] if states else "UNKNOWN",
                   reason=str(job.get("state_reason") or ""), nodes="" if nodes in ("(null)", "None") else nodes,
                   exit_code=exit_code_text(job.get("exit_code")), restarts=json_number(job.get("restart_cnt")) or 0,
                   stdout=str(job.get("standard_output") or ""), raw=dict(job))


def parse_jobs_json(text: str, job_id: int) -> Optional[JobInfo]:
    """The job job_id of a `{"jobs": [...]}` document (22.05's squeue --json lists every job)."""
    data = json.loads(text)
    found = [parse_job_json(job) for job in data.get("jobs", []) if json_number(job.get("job_id")) == job_id]
    return found[-1] if found else None


def parse_sacct_json(text: str, job_id: int) -> Optional[JobInfo]:
    """The newest record of job_id in `sacct --json` (a requeued job has one per run)."""
    data = json.loads(text)
    best = None
    for job in data.get("jobs", []):
        if json_number(job.get("job_id")) != job_id:
            continue
        best = job  # the last record is the newest attempt
    if best is None:
        return None
    state = best.get("state")
    states = json_states(state)
    reason = str(state.get("reason", "")) if isinstance(state, dict) else ""
    return JobInfo(job_id=job_id, state=states[0] if states else "UNKNOWN", reason=reason,
                   nodes=str(best.get("nodes", "")), exit_code=exit_code_text(best.get("exit_code")), raw=best)


def parse_sacct_row(row: Mapping[str, str], job_id: int) -> JobInfo:
    """One `sacct --parsable2` row (JobID, State, NodeList, ExitCode): State may read `CANCELLED by 0`."""
    words = row.get("State", "").split()
    nodes = row.get("NodeList", "")
    return JobInfo(job_id=job_id, state=words[0].upper() if words else "UNKNOWN",
                   nodes="" if nodes in ("None assigned", "(null)") else nodes, exit_code=row.get("ExitCode", ""),
                   raw=dict(row))


def parse_time(value: str) -> Optional[float]:
    """scontrol's local `2026-11-30T12:00:00` as a Unix time; `Unknown`, `None`, `N/A` as None."""
    try:
        return datetime.datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


_HOSTLIST_ELEMENT = re.compile(r"(?:[^,\[]|\[[^\]]*\])+")
_HOSTLIST_GROUP = re.compile(r"\[([^\]]*)\]")


def hostlist_size(hostlist: str) -> Optional[int]:
    """How many names a Slurm hostlist (`node[1-4,7],gpu01`) stands for, counted without expanding
    it (`n[0-99999999]` is 10**8 names: bound it before anyone expands it); None when it is no
    hostlist this reads."""
    total = 0
    for element in _HOSTLIST_ELEMENT.findall(hostlist):
        count = 1
        for group in _HOSTLIST_GROUP.findall(element):
            size = 0
            for part in group.split(","):
                low, dash, high = part.partition("-")
                if not low.isdigit() or (dash and not high.isdigit()) or (dash and int(high) < int(low)):
                    return None
                size += int(high) - int(low) + 1 if dash else 1
            count *= size
        total += count
    return total


def owner_rows(rows: Sequence[Mapping[str, str]], job_id: int, uid: int, ended_after_s: Optional[float] = None
               ) -> List[Mapping[str, str]]:
    """The accounting rows of job_id's runs by uid, with their steps (a step row follows its job's
    row and carries no uid): a reused job id's runs by another user name none of their nodes, nor
    do runs that ended before ended_after_s (a reused id's old runs, the same user's too)."""
    kept: List[Mapping[str, str]] = []
    theirs = False
    for row in rows:
        base = row["JobID"].split(".")[0]
        if base != str(job_id):
            theirs = False
            continue
        if row["JobID"] == base:
            end = parse_time(row.get("End", ""))
            theirs = row["UID"] == str(uid) and not (ended_after_s is not None and end is not None
                                                     and end < ended_after_s)
        if theirs:
            kept.append(row)
    return kept
