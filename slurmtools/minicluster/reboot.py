"""The mini-cluster's RebootProgram: a node "reboots" by restarting its slurmd.

`scontrol reboot` makes slurmd run RebootProgram on the node. A real node goes down and comes
back with a new boot time, and slurmctld counts the reboot done only when the node registers
with a boot time after the request (else, after ResumeTimeout: "reboot timed out"). Here the
node's slurmd is stopped and started again inside a new time namespace whose boot clock starts
near zero (`unshare --time --boottime`), so the new slurmd reports a boot time of now.

Two stages. `request` is what slurmd runs: it starts `restart` in a session of its own (slurmd
26.05 kills the program's process group when the program exits, and the restart must outlive
both it and the slurmd it stops), waits until that stage says it started, and exits 0.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import List

from slurmtools.minicluster import daemons, node_files
from slurmtools.minicluster.layout import MiniClusterLayout
from slurmtools.minicluster.record import layout_from_record

STARTED_WAIT_S = 10.0
STOP_WAIT_S = 30.0
REQUEST_MARGIN_S = 2.0


def program_text(layout: MiniClusterLayout, python: str = sys.executable) -> str:
    """The RebootProgram script (slurm.conf takes a path, not a command line)."""
    return (f"#!/bin/sh\n# slurmtools mini-cluster: restart this node's slurmd (slurmtools/minicluster/reboot.py)\n"
            f"exec {python} -m slurmtools.minicluster.reboot {layout.root} {layout.name} request\n")


def marker(layout: MiniClusterLayout, node: str) -> Path:
    return layout.run_dir / f"reboot-{node}.started"


def host_uptime_s() -> float:
    """The machine's uptime: ours, less our time namespace's boot-clock offset (a previous
    reboot's); /proc/1/ns/time may not be open to us in a container."""
    uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    return uptime_s - boottime_offset_s(Path("/proc/self/timens_offsets").read_text())


def boottime_offset_s(offsets: str) -> float:
    """'monotonic 0 0\nboottime -100 0' -> -100.0."""
    for line in offsets.splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == "boottime":
            return int(words[1]) + int(words[2]) / 1e9
    return 0.0


def restart_argv(layout: MiniClusterLayout, node: str, uptime_s: float) -> List[str]:
    """slurmd again, in a time namespace whose boot clock reads under 1 s (the offset may not
    make it negative): slurmd reports uptime 0, a boot time of now."""
    offset = -max(int(uptime_s), 0)
    return ["unshare", "--time", f"--boottime={offset}", *layout.command(["/usr/sbin/slurmd", "-N", node])]


def request(layout: MiniClusterLayout, node: str) -> int:
    flag = marker(layout, node)
    flag.unlink(missing_ok=True)
    log = open(layout.log_dir / f"reboot-{node}.log", "ab")
    subprocess.Popen([sys.executable, "-m", "slurmtools.minicluster.reboot", str(layout.root), layout.name, "restart"],
                     stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True)
    deadline = time.monotonic() + STARTED_WAIT_S
    while time.monotonic() < deadline and not flag.exists():
        time.sleep(0.05)
    return 0 if flag.exists() else 1


def restart(layout: MiniClusterLayout, node: str) -> int:
    marker(layout, node).write_text(f"{os.getpid()}\n")
    # let slurmd answer the request first, and put the new boot time (whole seconds) clearly after
    # the time slurmctld recorded for the request: an equal or earlier one is "not rebooted yet"
    time.sleep(REQUEST_MARGIN_S)
    pidfile = layout.slurmd_pidfile(node)
    daemons.stop_daemon(layout, f"slurmd-{node}", daemons.read_pidfile(pidfile), STOP_WAIT_S)
    pidfile.unlink(missing_ok=True)
    node_files.wipe_node_memory(layout, node)          # a reboot empties the node's RAM
    subprocess.run(restart_argv(layout, node, host_uptime_s()), check=True, env=daemons.daemon_env(layout),
                   stdin=subprocess.DEVNULL, timeout=60)
    print(f"{time.strftime('%F %T')} {node}: slurmd restarted (pid {daemons.read_pidfile(pidfile)})", flush=True)
    return 0


def main(argv: List[str]) -> int:
    if len(argv) != 3 or argv[2] not in ("request", "restart"):
        print("usage: python -m slurmtools.minicluster.reboot STATE_DIR NAME request|restart", file=sys.stderr)
        return 2
    layout = layout_from_record(Path(argv[0]), argv[1])
    node = socket.gethostname().split(".")[0]     # the node's UTS namespace names it
    if node not in layout.node_names:
        print(f"reboot: {node!r} is not a node of mini-cluster {layout.name!r}", file=sys.stderr)
        return 2
    return request(layout, node) if argv[2] == "request" else restart(layout, node)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
