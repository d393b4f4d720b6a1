"""Thin command-line layer: parse arguments, call the library, map errors to exit codes.

Every expected failure is a SlurmToolsError and becomes one line on stderr with a
non-zero exit code (2 for bad input, 1 for a failed operation); never a traceback.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

from slurmtools.errors import SlurmToolsError, UsageError

REPO_ROOT = Path(__file__).resolve().parent.parent

Handler = Callable[[argparse.Namespace], int]
_COMMANDS: Dict[str, Handler] = {}


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is a UsageError (one line, exit 2) like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


# ---- minicluster -------------------------------------------------------------------
def _minicluster_layout(args: argparse.Namespace):
    from slurmtools.minicluster.cluster import default_controller_host, layout_from_record
    from slurmtools.minicluster.layout import MiniClusterLayout

    state_dir = Path(args.state_dir)
    if getattr(args, "action", "") != "up":
        return layout_from_record(state_dir)
    try:
        return MiniClusterLayout(state_dir=state_dir, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                                 controller_host=default_controller_host(),
                                 prolog_dir=Path(args.prolog_dir).resolve(), epilog_dir=Path(args.epilog_dir).resolve())
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def cmd_minicluster(args: argparse.Namespace) -> int:
    from slurmtools import slurm
    from slurmtools.minicluster import cluster

    layout = _minicluster_layout(args)
    if args.action == "up":
        nodes = cluster.up(layout, install=not args.no_install, wait_s=args.wait_s)
        print(cluster.format_table(nodes))
        return 0
    if args.action == "down":
        cluster.down(layout, purge=args.purge)
        print("mini-cluster is down" + (" and its state removed" if args.purge else ""))
        return 0
    if args.action == "status":
        print(cluster.format_table(slurm.nodes()))
        return 0
    node = args.node
    try:
        layout.node_index(node)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    actions = {"kill": cluster.kill_node, "partition": cluster.partition_node,
               "heal": cluster.heal_node, "restart": cluster.restart_node}
    actions[args.action](layout, node)
    print(f"{args.action}: {node}")
    return 0


def _add_minicluster(sub) -> None:
    from slurmtools.minicluster.layout import DEFAULT_STATE_DIR

    p = sub.add_parser("minicluster", help="a real multi-node Slurm on this machine (root, Debian)")
    p.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR),
                   help="where all config, logs and state live (env SLURMTOOLS_MINICLUSTER_DIR)")
    acts = p.add_subparsers(dest="action", required=True, parser_class=_Parser)
    up = acts.add_parser("up", help="install (if missing) and start the cluster; wait until nodes are idle")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--gpus-per-node", type=int, default=4)
    up.add_argument("--prolog-dir", default=str(REPO_ROOT / "prolog.d"))
    up.add_argument("--epilog-dir", default=str(REPO_ROOT / "epilog.d"))
    up.add_argument("--no-install", action="store_true", help="do not apt-get install missing packages")
    up.add_argument("--wait-s", type=float, default=60.0)
    down = acts.add_parser("down", help="stop everything `up` started and undo its system changes")
    down.add_argument("--purge", action="store_true", help="also delete the state directory")
    acts.add_parser("status", help="node table")
    for name, what in (("kill", "kill the node: its slurmd and every process in its namespace"),
                       ("partition", "take the node's link down"), ("heal", "bring the node's link back up"),
                       ("restart", "restart the node's slurmd")):
        a = acts.add_parser(name, help=what)
        a.add_argument("node")
    p.set_defaults(func=cmd_minicluster)


# ---- main --------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from slurmtools import __version__

    parser = _Parser(prog="slurmtools", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"slurmtools {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in _ADDERS:
        add(sub)
    return parser


_ADDERS = [_add_minicluster]


def main(argv: Optional[List[str]] = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except SlurmToolsError as exc:
        print(f"slurmtools: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("slurmtools: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
