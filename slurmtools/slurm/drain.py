"""Drains we own: a structured, prefixed reason, and never touching a reason a person set.

Reason format (parseable, short enough for Slurm and `sinfo -R`):
    slurmtools: CRITICAL gpu.ecc gpu=3 dbe=2 job=1234
Only reasons that start with the prefix are ever resumed or overwritten by slurmtools.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from slurmtools.errors import UsageError
from slurmtools.slurm import commands as slurm

PREFIX = "slurmtools:"
MAX_REASON_CHARS = 200
_SAFE = re.compile(r"[^A-Za-z0-9_.,:;=+@/%()\[\]#<>-]")
_FIELD_LIKE = re.compile(r"^([A-Z][A-Za-z0-9_:/]*)=")


@dataclass(frozen=True)
class DrainReason:
    status: str
    check: str
    detail: str
    job: Optional[str] = None
    user: Optional[str] = None      # whose job's evidence it is (a blame the root side accepted)

    def render(self) -> str:
        """One printable line of at most MAX_REASON_CHARS; every part is sanitized, and truncation
        cuts the detail (never the user and job id), never the prefix, status and check that make it ours."""
        head = f"{PREFIX} {_safe(self.status)[:16]} {_safe(self.check)[:48]}"
        job = re.sub(r"[^0-9_+.]", "", self.job)[:24] if self.job else ""     # job ids: 123, 123_4, 123+1
        user = _safe(self.user)[:32] if self.user else ""
        suffix = (f" user={user}" if user else "") + (f" job={job}" if job else "")
        # a word like `Reason=x` would start a new field where scontrol's one-line records are
        # read back (slurm_parse.parse_scontrol_record): its `=` becomes `:`
        detail = " ".join(_FIELD_LIKE.sub(r"\1:", _safe(word)) for word in self.detail.split())
        room = MAX_REASON_CHARS - len(head) - len(suffix)
        if detail and room > 4:
            head += " " + (detail if len(detail) < room else detail[:room - 4] + "...")
        return head + suffix


def _safe(text: str) -> str:
    """Only characters that are harmless in scontrol's argv, sinfo output and our own parser."""
    return _SAFE.sub("_", text) if text.isascii() else _SAFE.sub("_", text.encode("ascii", "replace").decode())


# What slurmctld itself appends to a drained node's reason when the node then fails (24.11 and
# 26.05 seen: "<our reason> : Not responding" after the node we drained stopped answering); 22.05
# keeps the reason as it was.
_SLURM_NOTE = re.compile(r" : (Not responding|Kill task failed|Node unexpectedly rebooted|Prolog error|"
                         r"Epilog error|batch job complete failure)$")


def without_slurm_notes(reason: str) -> str:
    """The reason as it was set, without the notes slurmctld appended later."""
    text = reason.strip()
    while True:
        stripped = _SLURM_NOTE.sub("", text)
        if stripped == text:
            return text
        text = stripped


def is_ours(reason: str) -> bool:
    return reason.strip().startswith(PREFIX)


def parse_reason(reason: str) -> Optional[Dict[str, str]]:
    """Inverse of render() for our own reasons (Slurm's later notes dropped); None for anybody else's."""
    if not is_ours(reason):
        return None
    words = without_slurm_notes(reason)[len(PREFIX):].split()
    if len(words) < 2:
        return None
    out = {"status": words[0], "check": words[1]}
    rest = []
    for word in words[2:]:
        if word.startswith("job="):
            out["job"] = word[4:]
        elif word.startswith("user="):
            out["user"] = word[5:]
        else:
            rest.append(word)
    out["detail"] = " ".join(rest)
    return out


# the reasons slurmctld writes itself when it marks a node DOWN: our drain may follow (a node the
# job found dead stays out of service once its slurmd answers again, until a person looks)
SLURMS_OWN_DOWN_REASONS = ("Not responding", "Node unexpectedly rebooted")


def left_alone(node: slurm.NodeInfo) -> bool:
    """A node our drain must not touch: drained already (a person's reason, or our own first
    evidence), FAIL or FAILING, in maintenance (MAINT), or DOWN for a reason slurmctld did not
    write itself (a person's "RMA, do not resume")."""
    if node.drained or node.state in ("fail", "failing") or {"MAINT", "MAINTENANCE"} & set(node.flags):
        return True
    return node.state == "down" and not node.reason.startswith(SLURMS_OWN_DOWN_REASONS)


def drain(node: str, reason: DrainReason) -> bool:
    """Drain node with our reason unless it is left alone (left_alone): a person's reason is
    never overwritten, and our own first reason (the original evidence) is kept. Returns True
    when this call drained the node."""
    return _unless_left_alone(node, lambda: slurm.drain_node(node, reason.render()))


def reboot(node: str, reason: DrainReason) -> bool:
    """Like drain(), but ask Slurm to reboot the node once idle and resume it (health/remedy.py);
    a node left alone (left_alone) stays as it is."""
    return _unless_left_alone(node, lambda: slurm.reboot_node(node, reason.render()))


def _unless_left_alone(node: str, act: Callable[[], None]) -> bool:
    """act() on the node unless Slurm shows it left alone; True when it acted."""
    current = slurm.nodes(node)
    if current and left_alone(current[0]):
        return False
    act()
    return True


def drain_manual(node: str, text: str) -> None:
    """A person draining through slurmtools: our prefix with status MANUAL, so `nodes resume`
    can undo it, while automatic resume (which only touches CRITICAL drains) never does."""
    import getpass
    if not text.strip() or any(not char.isprintable() for char in text):
        raise UsageError("--reason must be one line of text")
    slurm.drain_node(node, DrainReason("MANUAL", "admin", text, None).render() + f" by={getpass.getuser()}")


def auto_resumable(reason: str) -> bool:
    parsed = parse_reason(reason)
    return parsed is not None and parsed["status"] == "CRITICAL"


def resume(node: str, *, force: bool = False) -> None:
    """Resume a node we drained; a person's drain only with force."""
    current = slurm.nodes(node)
    if not current:
        raise UsageError(f"unknown node {node!r}")
    info = current[0]
    if info.reason and not is_ours(info.reason) and not force:
        raise UsageError(f"{node} was drained by {info.reason_user or 'someone else'} "
                         f"({info.reason!r}); not ours to resume (use --force)")
    slurm.resume_node(node)


def unhealthy_nodes() -> List[slurm.NodeInfo]:
    return [n for n in slurm.nodes() if n.drained or n.state in ("down", "fail") or "NOT_RESPONDING" in n.flags]


def nodes_json(rows: Sequence[slurm.NodeInfo]) -> str:
    return json.dumps([{"node": n.name, "state": n.display_state, "reason": n.reason, "by": n.reason_user,
                        "since": n.reason_time, "ours": is_ours(n.reason)} for n in rows], sort_keys=True)


def nodes_table(rows: Sequence[slurm.NodeInfo]) -> str:
    """NODE STATE BY SINCE REASON, aligned; the reason last and whole."""
    table = [("NODE", "STATE", "BY", "SINCE", "REASON")]
    table += [(n.name, n.display_state, n.reason_user or "-", n.reason_time or "-", n.reason or "-") for n in rows]
    widths = [max(len(row[col]) for row in table) for col in range(4)]
    return "\n".join("  ".join(f"{row[col]:<{widths[col]}}" for col in range(4)) + "  " + row[4] for row in table)
