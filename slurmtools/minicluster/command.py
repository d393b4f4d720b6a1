"""`slurmtools minicluster ...`: the mini-cluster's commands (argument parsing and dispatch only)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from slurmtools.errors import UsageError

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def cmd_minicluster(args: argparse.Namespace) -> int:
    from slurmtools.slurm import commands as slurm
    from slurmtools.minicluster import cluster, faults

    name = args.name
    state_dir = Path(args.state_dir) if args.state_dir else None
    if args.action == "list":
        print(json.dumps(cluster.cluster_rows()) if args.json else cluster.format_list())
        return 0
    if args.action == "up":
        layout = cluster.layout_for_up(name, state_dir, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                                       prolog_dir=Path(args.prolog_dir), epilog_dir=Path(args.epilog_dir),
                                       cgroups=not args.no_cgroups, slurm_release=args.slurm)
        nodes = cluster.up(layout, install=not args.no_install, wait_s=args.wait_s,
                           progress=lambda line: print(f"minicluster up: {line}", file=sys.stderr, flush=True))
        print(cluster.format_table(nodes))
        if layout.client_bin_dir:
            print(f"Slurm {layout.slurm_release} runs from {layout.slurm_root}; its commands: "
                  f"eval \"$(slurmtools minicluster --name {name} env)\"")
        return 0
    layout = cluster.find_layout(name, state_dir)
    if args.action == "down":
        cluster.down(layout, purge=args.purge)
        print(f"mini-cluster {name} is down" + (" and its state removed" if args.purge else ""))
    elif args.action == "status":
        with slurm.using_conf(layout.slurm_conf, layout.client_bin_dir):
            nodes = slurm.nodes()
            print(json.dumps(cluster.node_rows(nodes)) if args.json else cluster.format_table(nodes))
    elif args.action == "env":
        print(cluster.format_env(layout))
    elif args.action == "restart-controller":
        faults.restart_controller(layout)
        print(f"restart-controller: {name}")
    else:
        if args.node not in layout.node_names:
            raise UsageError(f"unknown node {args.node!r}; cluster {name} has {layout.nodelist}")
        if args.action == "degrade":
            done = faults.degrade_node(layout, args.node, rate_mbit=args.rate_mbit, cpu_percent=args.cpu_percent)
            print(f"degrade: {args.node}: {', '.join(done)}")
            return 0
        actions = {"kill": faults.kill_node, "partition": faults.partition_node,
                   "heal": faults.heal_node, "restart": faults.restart_node}
        actions[args.action](layout, args.node)
        print(f"{args.action}: {args.node}")
    return 0


def _cluster_name(text: str) -> str:
    from slurmtools.minicluster.layout import NAME_PATTERN
    if not NAME_PATTERN.match(text):
        raise argparse.ArgumentTypeError(f"not a cluster name (1-8 lower-case letters or digits): {text[:20]!r}")
    return text


def add_minicluster(sub: Any, parser_class: Any) -> None:
    from slurmtools.minicluster.layout import BASE_DIR, NAME_ENV, default_name
    from slurmtools.minicluster.release import RELEASES

    parser = sub.add_parser("minicluster", help="a real multi-node Slurm on this machine (root, Debian)")
    parser.add_argument("--name", type=_cluster_name, default=default_name(),
                        help=f"which cluster (default: ${NAME_ENV}, else mini); each has its own everything")
    parser.add_argument("--state-dir", help=f"where its config, logs and state live (default {BASE_DIR}/NAME; "
                                            "base from $SLURMTOOLS_MINICLUSTER_DIR)")
    acts = parser.add_subparsers(dest="action", required=True, parser_class=parser_class)
    up = acts.add_parser("up", help="install (if missing) and start the cluster; wait until nodes are idle")
    up.add_argument("--nodes", type=int, default=3, help="how many nodes (slurmd in namespaces)")
    up.add_argument("--gpus-per-node", type=int, default=4, help="fake GPUs per node (character devices, gres)")
    up.add_argument("--prolog-dir", default=str(REPO_ROOT / "prolog.d"), help="the prolog scripts every node runs")
    up.add_argument("--epilog-dir", default=str(REPO_ROOT / "epilog.d"), help="the epilog scripts every node runs")
    up.add_argument("--no-install", action="store_true", help="do not apt-get install missing packages")
    up.add_argument("--no-cgroups", action="store_true", help="no job confinement (task/none): only where the "
                                                                  "machine has no usable cgroup v1 hierarchy")
    up.add_argument("--wait-s", type=float, default=60.0, help="how long to wait for every node to be idle")
    up.add_argument("--slurm", choices=list(RELEASES), help="the Slurm release to run (default: the machine's "
                                                            "own packages); another runs from a Debian root "
                                                            "built once into the state dir")
    down = acts.add_parser("down", help="stop everything `up` started and undo its system changes")
    down.add_argument("--purge", action="store_true", help="also delete the state directory")
    status = acts.add_parser("status", help="node table")
    status.add_argument("--json", action="store_true", help="print the nodes as JSON")
    listing = acts.add_parser("list", help="the named clusters on this machine")
    listing.add_argument("--json", action="store_true", help="print the clusters as JSON")
    acts.add_parser("env", help="shell exports (SLURM_CONF, and PATH for another release's commands) that "
                                "point Slurm's commands at this cluster")
    acts.add_parser("restart-controller", help="stop and start slurmctld (clients ride through)")
    for name, what in (("kill", "kill the node: its slurmd and every process in its namespace"),
                       ("partition", "take the node's link down"),
                       ("heal", "undo partition and degrade: link up, no rate limit, no CPU quota"),
                       ("restart", "restart the node's slurmd"),
                       ("degrade", "slow the node down: its link (tc tbf, both ways) and/or its CPU (cgroup quota)")):
        action_parser = acts.add_parser(name, help=what)
        action_parser.add_argument("node", help="the node, e.g. node2")
        if name == "degrade":
            action_parser.add_argument("--rate-mbit", type=int, help="link rate in Mbit/s, each way")
            action_parser.add_argument("--cpu-percent", type=int, help="CPU time of the node's processes, in "
                                                                       "percent of one core")
    parser.set_defaults(func=cmd_minicluster)
