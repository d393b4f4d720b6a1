"""Bridge and network namespaces: the mini-cluster's network.

All addresses are on a private bridge that exists only on this machine, plus an
`unreachable` route for the cluster's /24 (behind the bridge's own route, by metric) so
nothing can leak to a default gateway if the bridge disappears. Node names resolve through
the cluster's own hosts file, bound over /etc/hosts in the nodes' mount namespaces: the
machine's /etc/hosts is never edited.
"""
from __future__ import annotations

import fcntl
from pathlib import Path
from typing import Dict, List

from slurmtools.minicluster.layout import REGISTRY_DIR, MiniClusterLayout
from slurmtools.minicluster.sysrun import run

GUARD_METRIC = "4242"
# ARP requests a namespace sends for an address before a connect fails with "No route to host"
# (the kernel's default: 3, one a second). Every node of the mini-cluster shares the machine's few
# cores: with dozens of ranks importing torch at once the kernel may answer ARP late. A cluster's
# switches answer at once: 10 a second apart lets a loaded machine answer, and only the first
# resolution of an address waits (a known neighbour's probes, the path a partitioned node fails on,
# keep the default).
ARP_BROADCAST_PROBES = 10
# The kernel's ARP table is one for all namespaces, its hard limit (gc_thresh3) 1,024 entries by
# default: a full mesh of 33 nodes needs 33 x 32 and overflowed it ("neighbor table overflow!"),
# so a gloo group's first collective at 32 nodes took 35 s of failed connects and retries (3 ms
# at 4 nodes), the "No route to host" first put down to late ARP. Each real node has a table of its
# own: the mini-cluster raises the machine's limits to hold its own full mesh (never lowers them).
NEIGHBOUR_TABLE_DIR = Path("/proc/sys/net/ipv4/neigh/default")
KERNEL_NEIGHBOUR_DEFAULTS = {"gc_thresh1": 128, "gc_thresh2": 512, "gc_thresh3": 1024}
NEIGHBOUR_TABLE_LOCK = REGISTRY_DIR / "neighbour-table.lock"
MESHES_PER_THRESHOLD = {"gc_thresh1": 1, "gc_thresh2": 2, "gc_thresh3": 4}


def neighbour_table_floor(nodes: int) -> Dict[str, int]:
    """The ARP table limits that hold a full mesh of the nodes and the controller's bridge (every
    namespace knows every other node and the bridge; the bridge knows every node) below the
    threshold where the kernel starts collecting entries, the kernel's defaults on top for the
    machine's own neighbours: thresh1 (kept), thresh2 (collected after 5 s), thresh3 (refused)."""
    mesh = nodes * nodes + nodes
    return {name: default + MESHES_PER_THRESHOLD[name] * mesh for name, default in KERNEL_NEIGHBOUR_DEFAULTS.items()}


def raise_neighbour_table(nodes: int, table_dir: Path = NEIGHBOUR_TABLE_DIR,
                          lock: Path = NEIGHBOUR_TABLE_LOCK) -> None:
    """Raise the machine's ARP table limits to neighbour_table_floor(nodes) where lower; under a
    lock, so that clusters brought up side by side (the test lanes) never lower each other's."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        for name, floor in neighbour_table_floor(nodes).items():
            path = table_dir / name
            if int(path.read_text().split()[0]) < floor:
                path.write_text(f"{floor}\n")


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def guard_route(layout: MiniClusterLayout) -> List[str]:
    return ["unreachable", layout.subnet, "metric", GUARD_METRIC]


def subnet_in_use(layout: MiniClusterLayout) -> bool:
    """Any route for the cluster's subnet other than its own guard (another bridge or network)."""
    out = run(["ip", "-o", "route", "show", "to", "exact", layout.subnet], check=False).stdout
    return any("unreachable" not in line or GUARD_METRIC not in line for line in out.splitlines() if line.strip())


def net_up(layout: MiniClusterLayout) -> List[str]:
    """Create the bridge and one namespace per node; returns what it created (for the record)."""
    created: List[str] = []
    raise_neighbour_table(layout.nodes)
    if not link_exists(layout.bridge):
        run(["ip", "link", "add", layout.bridge, "type", "bridge"])
        run(["ip", "addr", "add", f"{layout.controller_addr}/24", "dev", layout.bridge])
        run(["ip", "ntable", "change", "name", "arp_cache", "dev", layout.bridge,
             "mcast_probes", str(ARP_BROADCAST_PROBES)])           # the controller's side: the same
        run(["ip", "link", "set", layout.bridge, "up"])
        run(["ip", "route", "replace", *guard_route(layout)], check=False)
        created.append(f"bridge:{layout.bridge}")
    for node in layout.node_names:
        ns, veth = layout.netns(node), layout.veth(node)
        if netns_exists(ns) and link_exists(veth):
            continue
        if not netns_exists(ns):
            run(["ip", "netns", "add", ns])
        if not link_exists(veth):
            run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
        run(["ip", "link", "set", veth, "master", layout.bridge])
        run(["ip", "link", "set", veth, "up"])
        run(["ip", "-n", ns, "addr", "replace", f"{layout.node_addr(node)}/24", "dev", "eth0"])
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        run(["ip", "-n", ns, "ntable", "change", "name", "arp_cache", "dev", "eth0",
             "mcast_probes", str(ARP_BROADCAST_PROBES)])
        run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        created.append(f"netns:{ns}")
    return created


def net_down(layout: MiniClusterLayout) -> None:
    """Remove namespaces, veths, bridge and the safety route; silent about what is already gone."""
    for node in layout.node_names:
        if netns_exists(layout.netns(node)):
            run(["ip", "netns", "del", layout.netns(node)], check=False)
        if link_exists(layout.veth(node)):
            run(["ip", "link", "del", layout.veth(node)], check=False)
    if link_exists(layout.bridge):    # the guard route went up with this cluster's bridge, and goes with it
        run(["ip", "link", "del", layout.bridge], check=False)
        run(["ip", "route", "del", *guard_route(layout)], check=False)


def set_link(layout: MiniClusterLayout, node: str, up: bool) -> None:
    """Partition (down) or heal (up) one node's link to the bridge."""
    run(["ip", "link", "set", layout.veth(node), "up" if up else "down"])


def namespace_pids(layout: MiniClusterLayout, node: str) -> List[int]:
    if not netns_exists(layout.netns(node)):
        return []
    out = run(["ip", "netns", "pids", layout.netns(node)], check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]
