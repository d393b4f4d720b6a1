"""The memory a job may still take on this node, from its memory cgroup (issue 46).

Slurm confines a job's memory with a cgroup (ConstrainRAMSpace): its processes' memory and the
files they write to /dev/shm are charged to it alike, so snapshots kept in node memory past the
job's limit end in an OOM kill of a rank -- a failure -- where a snapshot refused for its size is
only a line in the output. The snapshot budget (`snapshot_memory_gb`) is therefore also bounded by
the cgroup's headroom at the start of the step, shared by the node's ranks, of which
HEADROOM_SHARE is given to snapshots and the rest left for the job's own growth.

cgroup v2 (`0::/path` in /proc/self/cgroup; memory.max, memory.current) and v1 (the `memory`
controller's line; memory.limit_in_bytes, memory.usage_in_bytes); the tightest level from the
process's cgroup up to the root counts. The sysfs root is a parameter: tests give a tree of their own.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence, Tuple

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
HEADROOM_SHARE = 0.8
UNLIMITED_FROM = 1 << 60        # v1 writes "no limit" as a page-rounded 2**63 - 1
MAX_LEVELS = 64
V2_FILES = ("memory.max", "memory.current")
V1_FILES = ("memory.limit_in_bytes", "memory.usage_in_bytes")


def cgroup_of(proc_cgroup_text: str) -> Optional[Tuple[str, str]]:
    """("v2" or "v1", the memory cgroup's path) from /proc/<pid>/cgroup: the v1 memory controller's
    line when there is one (a hybrid host charges memory there), else the v2 line; None for neither."""
    unified = None
    for line in proc_cgroup_text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        if "memory" in fields[1].split(","):
            return "v1", fields[2]
        if fields[0] == "0" and fields[1] == "":
            unified = fields[2]
    return ("v2", unified) if unified is not None else None


def reclaimable_bytes(stat_text: str) -> int:
    """The inactive file cache of a memory.stat (v1's hierarchical total, else v2's): page cache
    the kernel drops before it OOM-kills (a checkpoint just read), unlike /dev/shm's pages."""
    values = {}
    for line in stat_text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("total_inactive_file", "inactive_file") and value.strip().isdigit():
            values[name] = int(value.strip())
    return values.get("total_inactive_file", values.get("inactive_file", 0))


def headroom_bytes(levels: Sequence[Tuple[str, str, str]]) -> Optional[int]:
    """The least (limit - usage + reclaimable cache) over the levels ((limit, usage, memory.stat)
    texts each), or None when no level has a limit; a level whose files say something else is
    passed over."""
    found: Optional[int] = None
    for limit_text, usage_text, stat_text in levels:
        limit_text, usage_text = limit_text.strip(), usage_text.strip()
        if not (limit_text.isdigit() and usage_text.isdigit()) or int(limit_text) >= UNLIMITED_FROM:
            continue              # "max" (v2's no limit), v1's 2**63, or unreadable
        working_set = max(0, int(usage_text) - reclaimable_bytes(stat_text))
        room = max(0, int(limit_text) - working_set)
        found = room if found is None else min(found, room)
    return found


def read_levels(version: str, path: str, root: Path) -> List[Tuple[str, str, str]]:
    """(limit, usage, memory.stat) texts of every level from path up to the hierarchy's root."""
    base = root / "memory" if version == "v1" else root
    limit_name, usage_name = V1_FILES if version == "v1" else V2_FILES
    levels = []
    parts = [part for part in path.split("/") if part and part not in (".", "..")][:MAX_LEVELS]
    for depth in range(len(parts), -1, -1):
        directory = base.joinpath(*parts[:depth])
        try:
            limit, usage = (directory / limit_name).read_text()[:64], (directory / usage_name).read_text()[:64]
        except (OSError, UnicodeDecodeError):
            continue
        try:
            stat = (directory / "memory.stat").read_text()[:65536]
        except (OSError, UnicodeDecodeError):
            stat = ""
        levels.append((limit, usage, stat))
    return levels


def job_headroom_bytes(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> Optional[int]:
    """This process's memory headroom by its cgroups now, or None (no limit, or none readable)."""
    try:
        found = cgroup_of(proc_cgroup.read_text()[:65536])
    except (OSError, UnicodeDecodeError):
        return None
    return headroom_bytes(read_levels(found[0], found[1], root)) if found else None


def rank_share_bytes(headroom: Optional[int], ranks_on_node: int) -> Optional[int]:
    """One rank's share of the headroom for its snapshots, or None when the cgroup sets no bound."""
    if headroom is None:
        return None
    return int(headroom * HEADROOM_SHARE / max(1, ranks_on_node))


def snapshot_limit_bytes(memory_gb: float, share: Optional[int]) -> Tuple[int, Optional[str]]:
    """(this rank's snapshot budget, a line saying the cgroup bound it, or None)."""
    asked = int(memory_gb * 1e9)
    if share is None or share >= asked:
        return asked, None
    return share, (f"snapshots: each rank's share of node memory is {share / 1e9:.3g} GB, not snapshot_memory_gb "
                   f"{memory_gb:g}: {HEADROOM_SHARE:.0%} of what the job's memory limit (its cgroup) left free on "
                   f"the node at the start, shared by its ranks there")
