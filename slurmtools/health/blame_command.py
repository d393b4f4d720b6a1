"""`slurmtools blames`: the admin's side of blames.

    slurmtools blames make-spool DIR    create the spool (root, mode 1733) that blame.spool_dir names
    slurmtools blames handle            handle waiting reports now (root): what every health run also
                                        does; as a HealthCheckProgram or cron job it bounds how long a
                                        blame waits when no prolog or epilog runs meanwhile
"""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from slurmtools.errors import UsageError
from slurmtools.health.admin_args import add_node_args


def cmd_make_spool(args: argparse.Namespace) -> int:
    from slurmtools.blame import spool
    if os.geteuid() != 0:
        raise UsageError("blames make-spool: run it as root (the spool is root's, mode 1733)")
    try:
        spool.make_spool(Path(args.dir))
    except (OSError, spool.SpoolError) as exc:
        raise UsageError(f"blames make-spool {args.dir}: {exc}") from None
    print(f"made {args.dir} (mode 1733); set it as blame.spool_dir in the health config")
    return 0


def cmd_handle(args: argparse.Namespace) -> int:
    from slurmtools.health.admin_args import root_node_settings
    from slurmtools.blame import intake, spool
    from slurmtools.errors import SlurmCommandError
    settings = root_node_settings(args, "blames handle", "it drains nodes")[1].blame
    if not settings.spool_dir:
        raise UsageError("blames handle: the health config sets no blame.spool_dir")
    try:
        handled = intake.handle(settings)
    except (spool.SpoolError, SlurmCommandError, OSError) as exc:
        raise UsageError(f"blames handle: {exc}") from None
    if args.json:
        print(json.dumps([asdict(result) for result in handled], sort_keys=True))
        return 0
    for result in handled:
        print(result.line())
    return 0


def add_blames(sub: Any) -> None:
    parser = sub.add_parser("blames", help="blames of nodes reported by jobs: the spool, and handling them (root)")
    acts = parser.add_subparsers(dest="blames_command", required=True)
    make = acts.add_parser("make-spool", help="create the blame spool (root-owned, mode 1733)")
    make.add_argument("dir", help="the spool directory to make")
    make.set_defaults(func=cmd_make_spool)
    handle = acts.add_parser("handle", help="check and drain (or refuse) every waiting blame now (root)")
    add_node_args(handle)
    handle.add_argument("--json", action="store_true", help="print what was done with each report as JSON")
    handle.set_defaults(func=cmd_handle)
