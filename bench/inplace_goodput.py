#!/usr/bin/env python3
"""What recovery in place is worth at scale: the goodput simulator (slurmtools.requeue.simulate, the
real policy) for 9,600 GPUs (1,200 nodes of 8, 6.5 failures per 1,000 node-days, 8 hot spares,
30-day runs, in-memory snapshots every 10 steps of 1 s, checkpoints at the Daly interval), every
node failure, crash and hang relaunched against every node failure a spare takes in place, every
crash restarted in place on its node and every hang whose node a spare takes in place. Fed
bench/resume.py's figures (its inplace section calls report() with what it measured; alone, the
figures given): the relaunch's detection and its fault-to-first-step rest, the in-place
fault-to-first-step of a node kill and of a rank crash, and a hang's in-place time after its
detection. Node failures (Llama 3's mix: 30.5% of interruptions), crashes (13%) and hangs (4%)
differ; GPU faults and the rest are relaunched in both rows. The relaunch is also given at
LARGE_JOB_RELAUNCH_S, the cost assumed for thousands of ranks (the mini-cluster's 4 to 32 ranks
import torch from a local disk).

    .venv/bin/python bench/inplace_goodput.py [--relaunch-detect-s 12.4] [--relaunch-rest-s 10.8]
        [--in-place-s 4.0] [--crash-in-place-s 2.6] [--hang-in-place-s 3.1]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurmtools.requeue import plan  # noqa: E402
from slurmtools.requeue.simulate import Scenario, default_mix, simulate  # noqa: E402

NODES, FAILURES_PER_1000_NODE_DAYS, SPARES, WORK_DAYS, TRIALS = 1200, 6.5, 8, 30.0, 60
CHECKPOINT_STALL_S, REQUEUE_S = 5.0, 60.0
# snapshots as bench/snapshot.py measured them (2026-12-03): every 10 steps of 1 s, 0.05 s stall,
# replicated 1.8 s after, restored from the peer's replica in 0.44 s
SNAPSHOT_EVERY_S, SNAPSHOT_STALL_S, REPLICATION_S, PEER_RESTORE_S = 10.0, 0.05, 1.8, 0.44
# a relaunch at thousands of ranks (imports from a shared file system, NCCL's start, every rank's
# load): docs/recovery.md's assumption for a large job, beside the mini-cluster's measured one
LARGE_JOB_RELAUNCH_S = 120.0


def report(*, relaunch_detect_s: float, relaunch_rest_s: float, in_place_s: float,
           crash_in_place_s: float, hang_in_place_s: float) -> None:
    node_mtbf_h = 1000.0 * 24.0 / FAILURES_PER_1000_NODE_DAYS
    daly_s = plan.plan(checkpoint_cost_s=CHECKPOINT_STALL_S, nodes=NODES, node_mtbf_h=node_mtbf_h).daly_interval_s
    base = dict(nodes=NODES, failures_per_1000_node_days=FAILURES_PER_1000_NODE_DAYS, work_days=WORK_DAYS,
                checkpoint_interval_s=daly_s, checkpoint_s=CHECKPOINT_STALL_S, requeue_s=REQUEUE_S,
                spare_nodes=SPARES, snapshot_interval_s=SNAPSHOT_EVERY_S, snapshot_s=SNAPSHOT_STALL_S,
                replication_s=REPLICATION_S, kinds=default_mix(node_detect_s=relaunch_detect_s))
    print(f"goodput, {NODES * 8:,} GPUs ({NODES} nodes), {FAILURES_PER_1000_NODE_DAYS:g} failures per 1,000 "
          f"node-days, {SPARES} spares, {WORK_DAYS:g}-day runs x {TRIALS}, snapshots every "
          f"{SNAPSHOT_EVERY_S:g} s, checkpoints every {daly_s / 60:.1f} min:", flush=True)
    for rest_s, where in ((relaunch_rest_s, "as measured"), (LARGE_JOB_RELAUNCH_S, "assumed for a large job")):
        scenario = dict(base, restart_s=rest_s + PEER_RESTORE_S)
        relaunched = simulate(Scenario(**scenario), TRIALS, seed=1)
        in_place = simulate(Scenario(in_place_s=in_place_s, crash_in_place_s=crash_in_place_s,
                                     hang_in_place_s=hang_in_place_s, **scenario), TRIALS, seed=1)
        print(f"  a relaunch {where} ({relaunch_detect_s:.1f} s detection + {rest_s + PEER_RESTORE_S:.1f} s), in "
              f"place {in_place_s:.1f} s (a crash {crash_in_place_s:.1f} s, a hang {hang_in_place_s:.1f} s after "
              f"its timeout): ETTR {relaunched.ettr_mean:.2%} relaunched -> {in_place.ettr_mean:.2%} "
              f"in place (without a person {relaunched.finished_without_person:.0%} / "
              f"{in_place.finished_without_person:.0%}; {relaunched.failures_mean:.0f} failures a run)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--relaunch-detect-s", type=float, default=12.4)
    parser.add_argument("--relaunch-rest-s", type=float, default=10.8)
    parser.add_argument("--in-place-s", type=float, default=4.0)
    parser.add_argument("--crash-in-place-s", type=float, default=2.6)
    parser.add_argument("--hang-in-place-s", type=float, default=3.1)
    args = parser.parse_args()
    if min(args.relaunch_detect_s, args.relaunch_rest_s, args.in_place_s, args.crash_in_place_s,
           args.hang_in_place_s) <= 0:
        parser.error("every figure must be positive")
    report(relaunch_detect_s=args.relaunch_detect_s, relaunch_rest_s=args.relaunch_rest_s, in_place_s=args.in_place_s,
           crash_in_place_s=args.crash_in_place_s, hang_in_place_s=args.hang_in_place_s)


if __name__ == "__main__":
    main()
