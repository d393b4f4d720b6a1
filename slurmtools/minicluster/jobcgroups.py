"""Job cgroups a killed mini-cluster node left behind.

Slurm's cgroup/v1 plugin makes /sys/fs/cgroup/<controller>/slurm_<node>/uid_<u>/job_<j>/step_<s>
(the node name is in the path because every slurmd of the mini-cluster runs on one machine). A
slurmd that is SIGKILLed (a `kill` fault, `down`) never removes its jobs' directories, and they
outlive the cluster. The next cluster reuses node names node1..N and starts its job ids at its
slot's first id again (layout.first_job_id), so a new job finds the old job_<id> directory with
the old cpuset: writing its own cpus fails with EBUSY, slurmstepd says "Slurmd could not execve
job", and the node is drained with "batch job complete failure" (seen when the test command's
two lanes reused a slot a killed cluster had). Empty directories are removed here (rmdir only
ever removes an empty cgroup; one with live tasks stays and is left alone); beside other clusters
only the cluster's own job ids.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional, Sequence

CGROUP_ROOT = Path("/sys/fs/cgroup")
# the controllers Slurm's cgroup/v1 plugins use (proctrack: freezer; task: cpuset, memory, devices)
SLURM_CONTROLLERS = ("cpuset", "memory", "devices", "freezer")


def node_cgroup_dirs(node: str, root: Path = CGROUP_ROOT, controllers: Sequence[str] = SLURM_CONTROLLERS) -> List[Path]:
    return [root / controller / f"slurm_{node}" for controller in controllers if (root / controller / f"slurm_{node}").is_dir()]


def _job_id(directory: Path, base: Path) -> Optional[int]:
    """The job id of a cgroup below slurm_<node>/uid_<u>/job_<j>[/...]; None above the job level."""
    parts = directory.relative_to(base).parts
    if len(parts) < 2 or not parts[1].startswith("job_") or not parts[1][4:].isdigit():
        return None
    return int(parts[1][4:])


def own_job_ids(first_job_id: int, count: int, *, beside_others: bool, recorded: bool) -> Optional[range]:
    """The job ids whose stale cgroups a cluster may remove: all of them (None) when no other
    mini-cluster runs here; beside others its slot's own range, and none at all when it has no
    record (never up here, or purged: its layout is then the default one, whose slot 0 may be
    another cluster's, and an empty cgroup of theirs may be a step's about to be entered: removing
    one failed a job's launch, "Slurmd could not execve job", R100)."""
    if not beside_others:
        return None
    if not recorded:
        return range(0)
    return range(first_job_id, first_job_id + count)


def remove_job_cgroups(node: str, root: Path = CGROUP_ROOT, controllers: Sequence[str] = SLURM_CONTROLLERS,
                       *, top: bool = False, job_ids: Optional[range] = None) -> List[Path]:
    """rmdir every empty cgroup below slurm_<node> (deepest first), and slurm_<node> itself when
    top; the directories removed. Only for a node whose slurmd is not running. job_ids: only the
    cgroups of those jobs (a cluster's own id range: every other cluster's node of the same name
    shares slurm_<node>, and an empty cgroup of theirs may be one a job is about to enter)."""
    removed: List[Path] = []
    for base in node_cgroup_dirs(node, root, controllers):
        below = sorted((Path(dirpath) for dirpath, _dirs, _files in os.walk(base)), key=lambda p: len(p.parts),
                       reverse=True)
        for directory in below:
            if directory == base and not top:
                continue
            if job_ids is not None and _job_id(directory, base) not in job_ids:
                continue
            try:
                directory.rmdir()
                removed.append(directory)
            except OSError:      # tasks still in it (EBUSY), or not empty: left alone
                pass
    return removed
