"""`slurmtools plan`: the checkpoint interval (Young/Daly) and predicted goodput; with --simulate,
the goodput simulator (slurmtools.requeue.simulate) at that interval."""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from typing import Any

from slurmtools.common.cli_args import positive
from slurmtools.errors import UsageError

# bench/resume.py on the rehearsal cluster (2026-11-30): a node found dead in 10.2 s, a restart on
# the spare 7.2 s after that (launch, load, first step); a real cluster's launch takes longer
DEFAULT_RESTART_IN_ALLOCATION_S = 7.2
DEFAULT_PERSON_H = 4.0
MAX_SIMULATED_FAILURES = 2e6       # about a minute of simulation on this machine


def add_plan(sub: Any) -> None:
    parser = sub.add_parser("plan", help="checkpoint interval (Young/Daly) and predicted goodput; --simulate: "
                                         "Monte Carlo with the real policy")
    parser.add_argument("--checkpoint-cost-s", type=positive(float), required=True,
                        help="training blocked per checkpoint")
    parser.add_argument("--nodes", type=positive(int), required=True, help="the job's node count")
    parser.add_argument("--node-mtbf-h", type=positive(float), required=True, help="mean time between failures of ONE node")
    parser.add_argument("--restart-cost-s", type=positive(float), default=60.0, help="requeue + launch + load")
    parser.add_argument("--simulate", action="store_true",
                        help="also simulate runs: the failure mix of Llama 3's interruptions, the real policy")
    parser.add_argument("--restart-in-allocation-s", type=positive(float), default=DEFAULT_RESTART_IN_ALLOCATION_S,
                        help="(--simulate) a restart on a spare or in place: launch + load")
    parser.add_argument("--spare-nodes", type=positive(int), default=0, help="(--simulate) hot spares")
    parser.add_argument("--work-days", type=positive(float), default=30.0, help="(--simulate) days of training wanted")
    parser.add_argument("--person-h", type=positive(float), default=DEFAULT_PERSON_H,
                        help="(--simulate) how long a stopped run waits for a person")
    parser.add_argument("--snapshot-interval-s", type=positive(float), default=0.0,
                        help="(--simulate) training between in-memory snapshots (distributed.snapshot_every_steps "
                             "x step time); 0: none")
    parser.add_argument("--snapshot-cost-s", type=positive(float), default=0.0,
                        help="(--simulate) training blocked per snapshot (bench/snapshot.py)")
    parser.add_argument("--replication-s", type=positive(float), default=0.0,
                        help="(--simulate) from a snapshot to its replica on the peer node (bench/snapshot.py)")
    parser.add_argument("--trials", type=positive(int), default=200, help="(--simulate) simulated runs")
    parser.add_argument("--seed", type=positive(int), default=1, help="(--simulate) random seed")
    parser.add_argument("--json", action="store_true", help="print the plan (and the simulation) as one JSON object")
    parser.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    from slurmtools.requeue import plan, simulate

    try:
        result = plan.plan(checkpoint_cost_s=args.checkpoint_cost_s, nodes=args.nodes, node_mtbf_h=args.node_mtbf_h,
                           restart_cost_s=args.restart_cost_s)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not args.json:
        print(plan.format_plan(result))
    if not args.simulate:
        if args.json:
            print(json.dumps({"plan": asdict(result), "simulation": None}, sort_keys=True))
        return 0
    if not 1 <= args.trials <= 100_000 or args.work_days > 3650:
        raise UsageError(f"--trials must be 1 to 100000 and --work-days at most 3650, got {args.trials} and "
                         f"{args.work_days:g}")
    # two simulations: GPU faults named to their node, and not
    failures_per_run = 2 * args.nodes * 24.0 / args.node_mtbf_h * args.work_days
    if failures_per_run * args.trials > MAX_SIMULATED_FAILURES:
        raise UsageError(f"--simulate: about {failures_per_run * args.trials:.3g} failures to simulate "
                         f"(2 simulations x nodes x days / node MTBF x trials); at most {MAX_SIMULATED_FAILURES:g}: fewer --trials "
                         f"or --work-days")
    try:
        scenario = simulate.Scenario(
            nodes=args.nodes, failures_per_1000_node_days=1000.0 * 24.0 / args.node_mtbf_h, work_days=args.work_days,
            checkpoint_interval_s=result.daly_interval_s, checkpoint_s=args.checkpoint_cost_s,
            restart_s=args.restart_in_allocation_s, requeue_s=args.restart_cost_s, spare_nodes=args.spare_nodes,
            person_s=args.person_h * 3600.0, snapshot_interval_s=args.snapshot_interval_s,
            snapshot_s=args.snapshot_cost_s, replication_s=args.replication_s,
            # the cap promised above holds for runs that fail more than expected too
            max_failures=max(1, int(MAX_SIMULATED_FAILURES / (2 * args.trials))))
    except ValueError as exc:
        raise UsageError(f"--simulate: {exc}") from None
    named = simulate.simulate(scenario, args.trials, args.seed)
    if not args.json:
        print(simulate.format_summary(named))
    unnamed = simulate.simulate(replace(scenario, kinds=simulate.default_mix(attribute_gpu_faults=False)),
                                args.trials, args.seed)
    if args.json:          # GPU faults named to their node, and (what attribution is worth) not
        print(json.dumps({"plan": asdict(result), "simulation": {"gpu_faults_named": asdict(named),
                                                                  "gpu_faults_not_named": asdict(unnamed)}},
                         sort_keys=True))
    else:
        print(simulate.format_attribution(named, unnamed))
    return 0
