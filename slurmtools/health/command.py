"""`slurmtools health ...` and `slurmtools nodes ...`: the admin's commands on the nodes (argument
parsing and dispatch; the work is in the health package and slurm/drain.py). `health run` is what
the prolog and epilog shims call, so its imports stay inside the functions: start-up time is the
prolog's."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from slurmtools.errors import Exit


def cmd_health_run(args: argparse.Namespace) -> int:
    import os

    from slurmtools.health import config, gate, report

    host = config.check_node_name(args.node) if args.node else config.this_host()
    settings = config.load_config(args.config).for_host(host)   # ConfigError: exit 2, never a drain
    outcome = gate.run_guarded(settings, args.phase, host, job_id=os.environ.get("SLURM_JOB_ID") or None,
                               allow_drain=not args.no_drain, job_owner=_job_owner(os.environ))
    if outcome is None:
        return gate.exit_now(Exit.FAILED)
    if args.json:
        print(gate.dump(outcome))
    elif not args.quiet:
        print(report.format_text(outcome.results))
        if outcome.drained_reason:
            print(f"drained {host}: {outcome.drained_reason}")
    return gate.exit_now(outcome.exit_code)


def _job_owner(environ: Any) -> Optional[Tuple[int, int]]:
    """The job's uid and gid as slurmd gives them to a prolog or epilog (root's environment there)."""
    uid, gid = environ.get("SLURM_JOB_UID", ""), environ.get("SLURM_JOB_GID", "")
    return (int(uid), int(gid or uid)) if uid.isdigit() and (gid.isdigit() or not gid) else None


def cmd_health_check_config(args: argparse.Namespace) -> int:
    from slurmtools.health import config, gate, registry

    health_config = config.load_config(args.config)
    hosts = [config.check_node_name(args.node)] if args.node else [config.this_host()]
    enabled: Dict[str, Dict[str, List[str]]] = {}
    for host in hosts:
        settings = health_config.for_host(host)
        gate.check_settings(settings)      # what the prolog would refuse, refused here too
        enabled[host] = {phase: [name for group in registry.GROUPS
                                 for name in registry.enabled(settings.checks, phase, group)]
                         for phase in config.PHASES}
    where = str(health_config.path) if health_config.path else None
    if args.json:
        print(json.dumps({"config": where, "ok": True, "checks": enabled}, sort_keys=True))
        return Exit.OK
    for host, phases in enabled.items():
        for phase, names in phases.items():
            print(f"{host} {phase}: {', '.join(names) or '(no checks)'}")
    print(f"{where or '(no config file: defaults)'}: OK for {', '.join(hosts)}")
    return Exit.OK


def cmd_health_record_gpu(args: argparse.Namespace) -> int:
    from slurmtools.health.gpu_probe import record_this_node

    text = record_this_node()
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return 0


def cmd_nodes(args: argparse.Namespace) -> int:
    from slurmtools.slurm import drain, commands as slurm

    if args.nodes_action == "drain":
        drain.drain_manual(args.node, args.reason)
        return 0
    if args.nodes_action == "resume":
        drain.resume(args.node, force=args.force)
        return 0
    rows = slurm.nodes() if args.all else drain.unhealthy_nodes()
    print(drain.nodes_json(rows) if args.json else drain.nodes_table(rows))
    return 0


def add_health(sub: Any) -> None:
    from slurmtools.health.config import PHASES

    parser = sub.add_parser("health", help="node health gate (prolog, epilog, HealthCheckProgram)")
    acts = parser.add_subparsers(dest="health_action", required=True)
    run = acts.add_parser("run", help="run the checks for a phase; exit 3 and drain on CRITICAL")
    run.add_argument("--phase", required=True, choices=PHASES,
                     help="which gate runs: its checks, and what a CRITICAL does")
    run.add_argument("--config", help="health.yaml (default: $SLURMTOOLS_HEALTH_CONFIG, beside $SLURM_CONF, "
                                      "/etc/slurmtools/health.yaml)")
    run.add_argument("--node", help="this node's Slurm name (default: $SLURMD_NODENAME or the hostname)")
    run.add_argument("--json", action="store_true", help="print every check's result as JSON")
    run.add_argument("--quiet", action="store_true", help="print nothing unless a check is not OK")
    run.add_argument("--no-drain", action="store_true", help="report only")
    run.set_defaults(func=cmd_health_run)
    cc = acts.add_parser("check-config", help="validate the health config for a host")
    cc.add_argument("--config", help="health config (default: as `health run` finds it)")
    cc.add_argument("--node", help="this node's name in the health config (default: the host name)")
    cc.add_argument("--json", action="store_true", help="print each phase's checks per host as one JSON object")
    cc.set_defaults(func=cmd_health_check_config)
    rec = acts.add_parser("record-gpu", help="record this node's NVML readings as a fixture (JSON)")
    rec.add_argument("--out", help="write the fixture to this file (default: standard output)")
    rec.set_defaults(func=cmd_health_record_gpu)
    rib = acts.add_parser("record-ib", help="copy this node's InfiniBand sysfs (kernel layout) into a directory")
    rib.add_argument("--out", required=True, help="a new or empty directory")
    rib.add_argument("--sysfs-root", default="/", help="where /sys is (default: /)")
    rib.set_defaults(func=_record_ib)

    nodes_parser = sub.add_parser("nodes", help="drained/down nodes with reason, who and since; drain and resume")
    nodes_parser.add_argument("--json", action="store_true", help="print the nodes as JSON")
    nodes_parser.add_argument("--all", action="store_true", help="every node, not only unhealthy ones")
    nodes_parser.set_defaults(func=cmd_nodes, nodes_action="list")
    nacts = nodes_parser.add_subparsers(dest="nodes_action")
    drain_parser = nacts.add_parser("drain", help="drain a node with a slurmtools MANUAL reason")
    drain_parser.add_argument("node", help="the node's name in Slurm")
    drain_parser.add_argument("--reason", required=True,
                              help="why, one line of text (kept after a slurmtools MANUAL prefix)")
    resume_parser = nacts.add_parser("resume", help="resume a node slurmtools drained (a person's drain needs --force)")
    resume_parser.add_argument("node", help="the node's name in Slurm")
    resume_parser.add_argument("--force", action="store_true", help="also resume a node that a person drained")


def _record_ib(args: argparse.Namespace) -> int:
    from slurmtools.health.record_ib import cmd_record_ib
    return cmd_record_ib(args)
