"""How long a node the job blamed stays in its requeues' ExcNodeList: not for ever.

A requeue excludes the nodes this job blamed or lost, added to what Slurm already excludes. Kept
for ever, the list only grows: over a weeks-long run, hang and straggler blames (often the
network or the file system, not the node) pile up until the job pends for nodes that no longer
exist for it. So each exclusion of ours lasts a time by its cause (EXCLUDED_FOR_H: a suspicion a
few hours, a node failure or a fatal fault a few days: an admin's repair and resume brings it
back) and then leaves the list; a node the user excluded (one our ledger never excluded) stays.
"""
from __future__ import annotations

from typing import Dict, FrozenSet, Sequence

from slurmtools.common import ledger
from slurmtools.common.ledger import Cause

SUSPICION_H = 6.0       # hang, straggler, collective timeout, preflight: the node may not be at fault
FAULT_H = 72.0          # the node failed (dead, a fatal GPU fault, wrong results)
EXCLUDED_FOR_H: Dict[str, float] = {
    Cause.HANG.value: SUSPICION_H, Cause.STRAGGLER.value: SUSPICION_H,
    Cause.COLLECTIVE_TIMEOUT.value: SUSPICION_H, Cause.PREFLIGHT.value: SUSPICION_H,
    Cause.NODE_FAILURE.value: FAULT_H, Cause.GPU_FATAL.value: FAULT_H, Cause.SDC.value: FAULT_H,
}


def excluded_until(events: Sequence[ledger.Event]) -> Dict[str, float]:
    """node -> until when this job's own exclusions keep it out (the latest, where blamed twice)."""
    until: Dict[str, float] = {}
    for event in events:
        if not isinstance(event, ledger.AttemptEnd) or not event.excluded:
            continue
        end_s = event.time_s + EXCLUDED_FOR_H.get(event.cause, SUSPICION_H) * 3600.0
        for node in event.excluded.split(","):
            if node:
                until[node] = max(until.get(node, end_s), end_s)
    return until


def expired(events: Sequence[ledger.Event], now_s: float) -> FrozenSet[str]:
    """The nodes whose every exclusion by this job has run out: they leave ExcNodeList."""
    return frozenset(node for node, end_s in excluded_until(events).items() if end_s <= now_s)
