"""System facts through psutil: memory, free disk on configured paths, mounts, process names."""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import psutil

from slurmtools.health.model import Mount, SystemFacts

GB = 1024 ** 3


def gather(disk_paths: Sequence[str], want_processes: bool) -> SystemFacts:
    vm = psutil.virtual_memory()
    free: Dict[str, Optional[float]] = {}
    for path in disk_paths:
        try:
            free[path] = psutil.disk_usage(path).free / GB
        except OSError:
            free[path] = None
    mounts = tuple(Mount(p.mountpoint, p.fstype) for p in psutil.disk_partitions(all=True))
    names = tuple(sorted({p.info["name"] or "" for p in psutil.process_iter(["name"])})) if want_processes else ()
    return SystemFacts(vm.available / GB, vm.total / GB, free, mounts, names)
