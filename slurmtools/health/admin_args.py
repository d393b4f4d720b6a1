"""What the admin's root-side commands (`blames handle`, `metrics relay`) share: root, this node's
name, and its settings from the health config."""
from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Tuple

from slurmtools.errors import UsageError

if TYPE_CHECKING:        # the health config is read only when one of these commands runs
    from slurmtools.health.config import NodeSettings


def root_node_settings(args: argparse.Namespace, command: str, why: str) -> Tuple[str, "NodeSettings"]:
    """(host, its settings), or UsageError when not root."""
    from slurmtools.health import config
    if os.geteuid() != 0:
        raise UsageError(f"{command}: run it as root ({why})")
    host = config.check_node_name(args.node) if args.node else config.this_host()
    return host, config.load_config(args.config).for_host(host)


def add_node_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="health config (default: as `health run` finds it)")
    parser.add_argument("--node", help="this node's name in the health config (default: the host name)")
