"""What to do with a node whose health run is CRITICAL: drain it for a person, or reboot it.

A reboot is the answer only when every CRITICAL finding is one that a GPU reset or node reboot
clears (the check marks it: details["remedy"] == "reboot", e.g. an XID whose catalogue action is
RESET_GPU), and only a bounded number of times: past `max_reboots_per_day` reboots in the last
24 hours the node is drained for a person, so a fault that a reboot does not clear can never
loop. Pure: the gate carries it out (scontrol reboot ASAP nextstate=RESUME) and keeps the times.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

from slurmtools.common.xid import REBOOT
from slurmtools.health.model import CheckResult, Status

DAY_S = 24 * 3600.0
DRAIN = "drain"


@dataclass(frozen=True)
class Remedy:
    action: str          # "drain" or "reboot"
    why: str             # for the result a person reads


def reboot_class(results: Sequence[CheckResult]) -> bool:
    critical = [r for r in results if r.status is Status.CRITICAL]
    return bool(critical) and all(r.details.get("remedy") == REBOOT for r in critical)


def recent(reboot_times: Sequence[float], now_s: float) -> List[float]:
    """The reboots requested in the last 24 hours (the window the bound counts)."""
    return [t for t in reboot_times if 0 <= now_s - t < DAY_S]


def decide(results: Sequence[CheckResult], reboot_times: Sequence[float], now_s: float,
           max_reboots_per_day: int) -> Remedy:
    if not reboot_class(results):
        return Remedy(DRAIN, "a finding a reboot does not clear")
    done = len(recent(reboot_times, now_s))
    if done >= max_reboots_per_day:
        return Remedy(DRAIN, f"reset-class fault again after {done} reboot(s) in 24 h (max_reboots_per_day="
                             f"{max_reboots_per_day}): a person must look")
    return Remedy(REBOOT, f"reset-class fault: reboot {done + 1} of at most {max_reboots_per_day} in 24 h")
