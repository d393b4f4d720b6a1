#!/usr/bin/env python3
"""Does the default failure budget let a long run go on? Failures arrive at random (Poisson) at
published per-node rates; after each, the real policy (slurmtools.requeue.policy.decide, default
RequeueSpec) decides with the job's history, every failure after some progress. Prints, per job
size and rate, the share of simulated 30-day runs that the budget would have stopped.

    .venv/bin/python bench/failure_budget.py [--days 30] [--trials 300] [--seed 1]
                                             [--max-restarts N] [--window-h H] [--nodes N ...]

Rates: Meta's research clusters report 2.3 to 6.5 failures per 1,000 node-days; Llama 3 had 419
interruptions in 54 days on 16,384 GPUs (2,048 nodes), 3.8 per 1,000 node-days.
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurmtools.common.ledger import AttemptRecord, Cause  # noqa: E402
from slurmtools.requeue.policy import Action, Diagnosis, decide
from slurmtools.spec import RequeueSpec  # noqa: E402

RATES_PER_1000_NODE_DAYS = (2.3, 3.8, 6.5)
NODE_COUNTS = (128, 1000, 2048, 10000)
HOUR_S = 3600.0


def stopped(nodes: int, rate: float, days: float, rnd: random.Random, limits: RequeueSpec) -> bool:
    """One simulated run: True when the policy stopped it."""
    per_s = nodes * rate / 1000.0 / (24 * HOUR_S)
    now_s, history, step = 0.0, [], 0
    while True:
        now_s += rnd.expovariate(per_s)
        if now_s > days * 24 * HOUR_S:
            return False
        step += 100                          # a checkpoint since the last failure
        verdict = decide(Diagnosis(Cause.CRASH, detail="exit 1"), history, limits, step, now_s=now_s)
        if verdict.action is Action.STOP:
            return True
        history.append(AttemptRecord(Cause.CRASH, True, step, None, now_s))
        history = history[-(limits.max_restarts + 1):]     # older ones are outside any window that matters


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-restarts", type=int, default=RequeueSpec().max_restarts)
    parser.add_argument("--window-h", type=float, default=RequeueSpec().restart_window_h)
    parser.add_argument("--nodes", type=int, nargs="+", default=list(NODE_COUNTS))
    args = parser.parse_args()
    limits = RequeueSpec(max_restarts=args.max_restarts, restart_window_h=args.window_h)
    rnd = random.Random(args.seed)
    print(f"budget: max_restarts={limits.max_restarts} within restart_window_h={limits.restart_window_h:g}; "
          f"{args.days:g}-day runs, {args.trials} trials each")
    print(f"{'nodes':>6} {'per 1k node-days':>17} {'failures/day':>13} {'runs stopped':>13}")
    for nodes in args.nodes:
        for rate in RATES_PER_1000_NODE_DAYS:
            share = sum(stopped(nodes, rate, args.days, rnd, limits) for _ in range(args.trials)) / args.trials
            print(f"{nodes:>6} {rate:>17.1f} {nodes * rate / 1000:>13.1f} {100 * share:>12.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
