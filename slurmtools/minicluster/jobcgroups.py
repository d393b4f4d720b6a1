"""Job cgroups a killed mini-cluster node left behind.

Slurm's cgroup/v1 plugin makes /sys/fs/cgroup/<controller>/slurm_<node>/uid_<u>/job_<j>/step_<s>
(the node name is in the path because every slurmd of the mini-cluster runs on one machine). A
slurmd that is SIGKILLed (a `kill` fault, `down`) never removes its jobs' directories, and they
outlive the cluster. The next cluster reuses node names node1..N and starts job ids at 1 again,
so a new job 3 finds the old job_3 directory with the old cpuset: writing its own cpus fails
with EBUSY, slurmstepd says "Slurmd could not execve job", and the node is drained with "batch
job complete failure". Empty directories are removed here (rmdir only ever removes an empty
cgroup; one with live tasks stays and is left alone).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Sequence

CGROUP_ROOT = Path("/sys/fs/cgroup")
# the controllers Slurm's cgroup/v1 plugins use (proctrack: freezer; task: cpuset, memory, devices)
SLURM_CONTROLLERS = ("cpuset", "memory", "devices", "freezer")


def node_cgroup_dirs(node: str, root: Path = CGROUP_ROOT, controllers: Sequence[str] = SLURM_CONTROLLERS) -> List[Path]:
    return [root / controller / f"slurm_{node}" for controller in controllers if (root / controller / f"slurm_{node}").is_dir()]


def remove_job_cgroups(node: str, root: Path = CGROUP_ROOT, controllers: Sequence[str] = SLURM_CONTROLLERS,
                       *, top: bool = False) -> List[Path]:
    """rmdir every empty cgroup below slurm_<node> (deepest first), and slurm_<node> itself when
    top; the directories removed. Only for a node whose slurmd is not running."""
    removed: List[Path] = []
    for base in node_cgroup_dirs(node, root, controllers):
        below = sorted((Path(dirpath) for dirpath, _dirs, _files in os.walk(base)), key=lambda p: len(p.parts),
                       reverse=True)
        for directory in below:
            if directory == base and not top:
                continue
            try:
                directory.rmdir()
                removed.append(directory)
            except OSError:      # tasks still in it (EBUSY), or not empty: left alone
                pass
    return removed
