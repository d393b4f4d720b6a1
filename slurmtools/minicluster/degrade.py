"""Slowing one mini-cluster node down, for the tests that preflight must pass: a token-bucket
rate limit (tc `tbf`; the kernels here have tbf and htb but not netem) on both ends of its
link, and a CFS quota on everything in its namespace (its slurmd's children inherit it).

The quota lives in a cgroup v1 `cpu` directory of our own: Slurm's cgroup plugins use the
cpuset, memory, devices and freezer controllers, never `cpu`, so a job's tasks stay in it.
`restore` undoes both and is silent about what is not there.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from slurmtools.errors import MiniClusterError
from slurmtools.minicluster import netns
from slurmtools.minicluster.layout import MiniClusterLayout
from slurmtools.minicluster.sysrun import run

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
CFS_PERIOD_US = 100_000
TBF_BURST = "32kb"
TBF_LATENCY = "100ms"


def cpu_dir(layout: MiniClusterLayout, node: str) -> Path:
    return CPU_ROOT / f"slurmtools-{layout.name}-{node}"


def _tc(layout: MiniClusterLayout, node: str, *args: str, check: bool = True) -> None:
    """The same qdisc change on the bridge's end of the node's veth (traffic to the node) and on
    the node's own eth0 (traffic from it)."""
    run(["tc", "qdisc", *args[:1], "dev", layout.veth(node), *args[1:]], check=check)
    run(["ip", "netns", "exec", layout.netns(node), "tc", "qdisc", *args[:1], "dev", "eth0", *args[1:]],
        check=check)


def limit_rate(layout: MiniClusterLayout, node: str, rate_mbit: int) -> None:
    if not 1 <= rate_mbit <= 100_000:
        raise MiniClusterError(f"--rate-mbit must be 1 to 100000, got {rate_mbit}")
    _tc(layout, node, "replace", "root", "tbf", "rate", f"{rate_mbit}mbit", "burst", TBF_BURST,
        "latency", TBF_LATENCY)


def cap_cpu(layout: MiniClusterLayout, node: str, cpu_percent: int) -> int:
    """Every process of the node limited to cpu_percent of one CPU; returns how many were moved."""
    if not 1 <= cpu_percent <= 100:
        raise MiniClusterError(f"--cpu-percent must be 1 to 100, got {cpu_percent}")
    if not (CPU_ROOT / "cgroup.procs").exists():
        raise MiniClusterError(f"no cgroup v1 cpu hierarchy at {CPU_ROOT}: cannot cap a node's CPU here")
    group = cpu_dir(layout, node)
    group.mkdir(exist_ok=True)
    (group / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
    (group / "cpu.cfs_quota_us").write_text(str(CFS_PERIOD_US * cpu_percent // 100))
    moved = 0
    for pid in netns.namespace_pids(layout, node):
        try:
            (group / "cgroup.procs").write_text(str(pid))
            moved += 1
        except OSError:
            pass            # gone meanwhile
    return moved


def degrade(layout: MiniClusterLayout, node: str, *, rate_mbit: Optional[int] = None,
            cpu_percent: Optional[int] = None) -> List[str]:
    if rate_mbit is None and cpu_percent is None:
        raise MiniClusterError("degrade: give --rate-mbit N, --cpu-percent P or both")
    done = []
    if rate_mbit is not None:
        limit_rate(layout, node, rate_mbit)
        done.append(f"link {rate_mbit} Mbit/s each way")
    if cpu_percent is not None:
        moved = cap_cpu(layout, node, cpu_percent)
        done.append(f"CPU {cpu_percent}% of one core ({moved} processes)")
    return done


def restore(layout: MiniClusterLayout, node: str) -> None:
    """Remove the rate limits and the CPU quota (processes go back to the root cpu group)."""
    if netns.link_exists(layout.veth(node)):
        _tc(layout, node, "del", "root", check=False)
    group = cpu_dir(layout, node)
    if group.is_dir():
        for line in (group / "cgroup.procs").read_text().split():
            try:
                (CPU_ROOT / "cgroup.procs").write_text(line)
            except OSError:
                pass
        try:
            group.rmdir()
        except OSError as exc:
            raise MiniClusterError(f"cannot remove {group}: {exc.strerror}") from None
