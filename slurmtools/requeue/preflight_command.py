"""`slurmtools preflight`: the same check by hand inside an allocation (salloc, an sbatch
script, a maintenance reservation): JSON lines on stdout, exit 0 when every node passed, 3
(NODE_BAD) when a node was named (with --drain: reported with the evidence for the root-owned
health hooks to drain; --direct-drain: drained with the caller's rights), 1 when the check itself
could not run. The supervisor runs it on its own (spec `preflight`); this is for people."""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from slurmtools.errors import Exit, SpecError, UsageError
from slurmtools.requeue import flags

def cmd_preflight(args: argparse.Namespace) -> int:
    from ClusterShell.NodeSet import NodeSet

    from slurmtools.requeue import preflight_launch as launch
    from slurmtools.requeue import actions
    from slurmtools.common.control_dir import attempt_of
    from slurmtools.common.schema import check_hostlist
    from slurmtools.common.rendezvous import pick_port

    args.preflight = True
    settings = flags.preflight_from_args(args)
    assert settings is not None
    job_text = os.environ.get("SLURM_JOB_ID")
    nodelist = os.environ.get("SLURM_JOB_NODELIST")
    if not job_text or not nodelist:
        raise UsageError("preflight: run it inside an allocation (salloc or an sbatch script): "
                         "SLURM_JOB_ID / SLURM_JOB_NODELIST are not set")
    job_number = attempt_of(os.environ)[0]
    if job_number is None:
        raise UsageError(f"preflight: SLURM_JOB_ID is not a Slurm job id: {job_text[:40]!r}")
    try:
        check_hostlist(nodelist, ("SLURM_JOB_NODELIST",))
    except SpecError as exc:
        raise UsageError(f"preflight: {exc}") from None
    if args.tasks_per_node < 1:
        raise UsageError(f"preflight: --tasks-per-node must be at least 1, got {args.tasks_per_node}")
    job_id = str(job_number)
    nodes = list(NodeSet(nodelist))
    env = dict(os.environ)
    env.setdefault("MASTER_ADDR", nodes[0])
    if "MASTER_PORT" not in env:
        env["MASTER_PORT"] = str(pick_port())
    for name in ("SLURM_NTASKS", "SLURM_NPROCS"):        # the allocation's, not the step's
        env.pop(name, None)
    report_dir = Path(args.report_dir) if args.report_dir else Path.cwd()
    train_argv = ["srun", f"--ntasks-per-node={args.tasks_per_node}", f"--nodes={len(nodes)}"]
    outcome = launch.run(train_argv, nodes, env, report_dir, settings, f"{job_id}.preflight")
    if args.drain or args.direct_drain:
        for node, finding in outcome.named.items():
            actions.drain_node(job_number, f"{job_id}.preflight", node, launch.diagnosis(finding),
                               direct=args.direct_drain)
    if outcome.status == "error":
        return Exit.FAILED
    return Exit.NODE_BAD if outcome.named else Exit.OK


def add_preflight(sub: Any) -> None:
    parser = sub.add_parser("preflight", help="(inside an allocation) check its nodes: compute canary, "
                                              "throughput, all-reduce pairs; exit 3 when a node is named")
    flags.add_preflight_arguments(parser)
    parser.add_argument("--tasks-per-node", type=int, default=1, help="tasks per node (one per GPU to check "
                                                                       "each GPU's link as well)")
    parser.add_argument("--drain", action="store_true", help="report each named node with the evidence to the "
                                                              "site's root-owned health hooks, which drain it")
    parser.add_argument("--direct-drain", action="store_true", help="drain each named node with your own rights "
                                                                     "(an admin or Slurm operator)")
    parser.add_argument("--report-dir", help="where the report (preflight.json) goes (default: the current "
                                             "directory, which every node must see)")
    parser.set_defaults(func=cmd_preflight)
