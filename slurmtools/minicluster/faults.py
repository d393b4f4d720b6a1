"""What the tests do to a running mini-cluster: kill a node (every process in its namespace, its
node memory gone with it), cut or degrade its link, restart its slurmd or the controller."""
from __future__ import annotations

import os
import signal
import time
from typing import List, Optional

from slurmtools.minicluster import daemons, degrade, netns, node_files
from slurmtools.minicluster.layout import MiniClusterLayout
from slurmtools.minicluster.record import load_record, save_record
from slurmtools.minicluster.sysrun import require_root


KILL_ROUNDS_TIMEOUT_S = 10.0


def kill_namespace(layout: MiniClusterLayout, node: str) -> List[int]:
    """SIGKILL every process in the node's network namespace: slurmd, slurmstepd, tasks.

    Rounds until the namespace is empty: a process forked between one listing and the kill of
    its parent (torchrun starting its ranks) is only in the next listing (CI stop 42: a rank
    forked while its node was killed during start-up outlived the node)."""
    killed: List[int] = []
    deadline = time.monotonic() + KILL_ROUNDS_TIMEOUT_S
    while True:
        alive = netns.namespace_pids(layout, node)
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                if pid not in killed:
                    killed.append(pid)
            except ProcessLookupError:
                pass
        if not alive or time.monotonic() > deadline:
            return killed
        time.sleep(0.05)


def kill_node(layout: MiniClusterLayout, node: str) -> List[int]:
    require_root()
    killed = kill_namespace(layout, node)
    node_files.wipe_node_memory(layout, node)
    return killed


def partition_node(layout: MiniClusterLayout, node: str) -> None:
    require_root()
    netns.set_link(layout, node, up=False)


def heal_node(layout: MiniClusterLayout, node: str) -> None:
    """Undo partition and degrade: the link up, no rate limit, no CPU quota."""
    require_root()
    netns.set_link(layout, node, up=True)
    degrade.restore(layout, node)


def degrade_node(layout: MiniClusterLayout, node: str, *, rate_mbit: Optional[int] = None,
                 cpu_percent: Optional[int] = None) -> List[str]:
    require_root()
    return degrade.degrade(layout, node, rate_mbit=rate_mbit, cpu_percent=cpu_percent)


def restart_controller(layout: MiniClusterLayout) -> None:
    """Stop slurmctld and start it again (state is saved): clients see "Unable to contact slurm
    controller" in between, the transient error slurm.py rides through."""
    stop_controller(layout)
    start_controller(layout)


def stop_controller(layout: MiniClusterLayout) -> None:
    """Stop slurmctld (its state saved) until start_controller: a controller outage."""
    require_root()
    daemons.stop_daemon(layout, "slurmctld", daemons.read_pidfile(layout.run_dir / "slurmctld.pid"))


def start_controller(layout: MiniClusterLayout) -> None:
    require_root()
    pid = daemons.start_slurmctld(layout)
    record = load_record(layout)
    if pid:
        record.setdefault("pids", {})["slurmctld"] = pid
        save_record(layout, record)


def restart_node(layout: MiniClusterLayout, node: str) -> None:
    """Restart the node's slurmd (brings a killed node back; ReturnToService=2 makes it idle)."""
    require_root()
    daemons.stop_daemon(layout, f"slurmd-{node}", daemons.read_pidfile(layout.slurmd_pidfile(node)))
    pid = daemons.start_slurmd(layout, node)
    record = load_record(layout)
    if pid:
        record.setdefault("pids", {})[f"slurmd-{node}"] = pid
        save_record(layout, record)
