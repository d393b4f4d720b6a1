"""Bridge, network namespaces and the /etc/hosts block: the mini-cluster's network.

All addresses are on a private bridge that exists only on this machine, plus an
`unreachable` route for the whole /16 so nothing can leak to a default gateway.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import List

from slurmtools.minicluster.layout import MiniClusterLayout, strip_hosts_block, with_hosts_block
from slurmtools.minicluster.sysrun import run

HOSTS_FILE = Path("/etc/hosts")


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def unreachable_route(layout: MiniClusterLayout) -> str:
    first_octet, second_octet, _ = layout.subnet_prefix.split(".")
    return f"{first_octet}.{second_octet}.0.0/16"


def net_up(layout: MiniClusterLayout) -> List[str]:
    """Create the bridge and one namespace per node; returns what it created (for the record)."""
    created: List[str] = []
    if not link_exists(layout.bridge):
        run(["ip", "link", "add", layout.bridge, "type", "bridge"])
        run(["ip", "addr", "add", f"{layout.controller_addr}/24", "dev", layout.bridge])
        run(["ip", "link", "set", layout.bridge, "up"])
        run(["ip", "route", "add", "unreachable", unreachable_route(layout)], check=False)
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
    if link_exists(layout.bridge):
        run(["ip", "link", "del", layout.bridge], check=False)
    run(["ip", "route", "del", "unreachable", unreachable_route(layout)], check=False)


def set_link(layout: MiniClusterLayout, node: str, up: bool) -> None:
    """Partition (down) or heal (up) one node's link to the bridge."""
    run(["ip", "link", "set", layout.veth(node), "up" if up else "down"])


def namespace_pids(layout: MiniClusterLayout, node: str) -> List[int]:
    if not netns_exists(layout.netns(node)):
        return []
    out = run(["ip", "netns", "pids", layout.netns(node)], check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.slurmtools.tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def hosts_add(layout: MiniClusterLayout, hosts_file: Path = HOSTS_FILE) -> None:
    """Node names must resolve inside jobs (torchrun rendezvous on `node1`)."""
    text = hosts_file.read_text() if hosts_file.exists() else ""
    new = with_hosts_block(text, layout.render_hosts_block())
    if new != text:
        _write_hosts(hosts_file, new)


def hosts_remove(hosts_file: Path = HOSTS_FILE) -> None:
    if not hosts_file.exists():
        return
    text = hosts_file.read_text()
    new = strip_hosts_block(text)
    if new != text:
        _write_hosts(hosts_file, new)


def _write_hosts(hosts_file: Path, text: str) -> None:
    # /etc/hosts is often a bind mount in containers: rename fails there, so write in place.
    try:
        _write_atomic(hosts_file, text)
    except OSError:
        hosts_file.write_text(text)
