"""Files the mini-cluster's nodes read besides Slurm's own: the health config the prolog, epilog
and blame handling use, the HealthCheckProgram that handles blames, the TaskProlog that gives each
node its own memory directory (and its wiping), and the nodes' /etc/hosts (text, unit-tested)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from slurmtools.minicluster.layout import MiniClusterLayout
from slurmtools.train.node_beat import NODE_LOCAL_DIR_ENV


def node_memory_root(layout: MiniClusterLayout) -> Path:
    """Below it, each node's own memory directory (`<root>/<node>`): the nodes share this machine's
    /dev/shm, where a real node has its own, which goes with the node when it dies (kill_node
    empties it), so no test can pass by reading a dead node's memory."""
    return Path("/dev/shm") / f"slurmtools-minicluster-{layout.name}"


def wipe_node_memory(layout: MiniClusterLayout, node: str) -> None:
    """The node's own memory directory, empty: what a dead or rebooted node's RAM held is gone.
    World-writable with the sticky bit, as /dev/shm is."""
    path = node_memory_root(layout) / node
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(mode=0o755, exist_ok=True)
    path.mkdir()
    path.chmod(0o1777)


def task_prolog_text(layout: MiniClusterLayout) -> str:
    """The TaskProlog (Slurm runs it as the job's user before each task; each `export` line it
    prints is set in the task's environment): the node's own memory directory, where jobs keep what
    lives in a node's memory (node_beat.py). A real cluster needs none of it: /dev/shm is the node's."""
    return ("#!/bin/sh\n# slurmtools mini-cluster: each node's own memory directory, as /dev/shm is on a real node\n"
            f'echo "export {NODE_LOCAL_DIR_ENV}={node_memory_root(layout)}/$(hostname)"\n')


# nodes per probe-second: a rehearsal's prologs and epilogs all share one machine's cores (130 nodes'
# epilogs at once on 2 cores took 13 s, and a 3-s probe of /proc/meminfo timed out and drained 4
# healthy nodes: R87); a real node runs its own alone, in the default time box
NODES_PER_PROBE_S = 4


def probe_time_box_s(nodes: int) -> "tuple[int, int]":
    """(probe_timeout_s, deadline_s) of a rehearsal of `nodes` nodes: the defaults up to 12 nodes,
    then a second per 4 nodes."""
    probe_s = max(3, nodes // NODES_PER_PROBE_S)
    return probe_s, probe_s + 2


def render_health_config(layout: MiniClusterLayout) -> str:
    """The fake nodes' GPUs come from a built-in fixture, named explicitly: a rehearsal cluster."""
    probe_s, deadline_s = probe_time_box_s(layout.nodes)
    return "\n".join([
        "# Written by `slurmtools minicluster up` (kept when it exists). Rehearsal settings: the",
        "# fake GPUs are served by a built-in NVML fixture, selected explicitly here.",
        "defaults:",
        '  gpu_probe: "fixture:minicluster-4gpu"' if layout.gpus_per_node else "  gpu_probe: none",
        "  kernel_log: null",
        f"  state_dir: {layout.root}/health",
        "  # every node's prolog and epilog share this machine's cores: the time box grows with the nodes",
        f"  probe_timeout_s: {probe_s}",
        f"  deadline_s: {deadline_s}",
        "  syslog: false",
        "  checks:",
        f"    gpu: {{count: {{expected: {layout.gpus_per_node}}}}}",
        "    system: {memory: {min_available_gb: 0.5}, disk: {paths: [/tmp], min_free_gb: 0.5}}",
        "  # jobs report the nodes they blame here; the health hooks check each report and drain",
        "  blame:",
        f"    spool_dir: {layout.blame_spool}",
        f"    munge_socket: {layout.munge_socket}",
        "    # a three-node rehearsal: one job's straggler or hang attribution is enough to drain",
        "    actions: {straggler: drain, hang: drain}",
        "    # every test's job is the same user's, and a session drains and resumes its few nodes",
        "    # again and again: the per-user and per-hour budgets are for clusters of many users",
        "    max_nodes_per_user_per_day: 10000",
        "    max_drains_per_hour: 100000",
        "  # jobs write metrics into an inbox of their own; the relay (root) vets them for node_exporter",
        "  job_metrics:",
        f"    inbox_dir: {layout.metrics_inbox}/%N",
        f"    textfile_dir: {layout.metrics_textfiles}/%N",
    ]) + "\n"


def render_hosts(layout: MiniClusterLayout) -> str:
    """The nodes' /etc/hosts: node names resolve inside jobs (torchrun rendezvous on `node1`)
    without any edit of the machine's /etc/hosts, and two clusters may both have a node1."""
    lines = ["# Written by `slurmtools minicluster up`: /etc/hosts inside this cluster's nodes.",
             "127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback",
             f"{layout.controller_addr} {layout.controller_host}"]
    lines += [f"{layout.node_addr(node)} {node}" for node in layout.node_names]
    return "\n".join(lines) + "\n"


def blames_program_text(layout: MiniClusterLayout, python: str = sys.executable) -> str:
    """The HealthCheckProgram (every 10 s on every node): `slurmtools metrics relay` when a job's
    metrics file waits in this node's inbox, then `slurmtools blames handle` when a report waits (a
    link or FIFO too: handling removes it); else nothing is started at all."""
    bin_dirs = f"{layout.client_bin_dir}:" if layout.client_bin_dir else ""
    run = f"/usr/bin/timeout -k 2 60 {python} -m slurmtools"
    return (f"#!/bin/sh\n# slurmtools mini-cluster: relay job metrics (slurmtools/metricsrelay) and handle the\n"
            f"# blames jobs reported (slurmtools/blame)\n"
            f"export SLURM_CONF={layout.slurm_conf} PATH={bin_dirs}/usr/sbin:/usr/bin:/sbin:/bin\n"
            'node=$(hostname)\n'
            f'for file in {layout.metrics_inbox}/"$node"/*/*.prom; do\n'
            '  [ -e "$file" ] || break\n'
            f'  {run} metrics relay --config {layout.health_config} --node "$node"\n'
            "  break\n"
            "done\n"
            f"for report in {layout.blame_spool}/blame.*.munge; do\n"
            '  [ -e "$report" ] || [ -L "$report" ] || exit 0\n'
            f"  exec {run} blames handle --config {layout.health_config}\n"
            "done\n")
