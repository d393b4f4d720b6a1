#!/usr/bin/env python3
"""What bench/snapshot.py's figures are worth at scale: steps lost per node failure and the goodput
simulator (slurmtools.requeue.simulate, the real policy) for 9,600 GPUs (1,200 nodes of 8, Meta's
research clusters' worst published rate: 6.5 failures per 1,000 node-days, 8 hot spares, 30 days of
training), checkpoints alone against checkpoints with in-memory snapshots.

The costs: a persistent checkpoint blocks training CHECKPOINT_STALL_S (the issue's assumption for a
large job on a shared file system; bench/checkpoint.py's async save blocks 0.03 s/GB on this
machine's local disk), taken at the Daly interval of slurmtools plan; a restart in the allocation
is bench/resume.py's 7.2 s (launch, load, first step) plus the restore measured by bench/snapshot.py
(from disk, or from the peer's replica); a snapshot blocks training for the measured stall and is
restorable once replicated (the measured replication time).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurmtools.requeue import plan  # noqa: E402
from slurmtools.requeue.plan_command import DEFAULT_RESTART_IN_ALLOCATION_S  # noqa: E402
from slurmtools.requeue.simulate import Scenario, simulate  # noqa: E402

NODES, FAILURES_PER_1000_NODE_DAYS, SPARES, WORK_DAYS, TRIALS = 1200, 6.5, 8, 30.0, 60
CHECKPOINT_STALL_S = 5.0
REQUEUE_S = 60.0
LONG_CHECKPOINT_INTERVAL_S = 1800.0     # with snapshots, the persistent checkpoint can be rarer


def report(*, stall_s: float, replication_s: float, every: int, step_s: float, peer_restore_s: float,
           disk_restore_s: float) -> None:
    node_mtbf_h = 1000.0 * 24.0 / FAILURES_PER_1000_NODE_DAYS
    daly_s = plan.plan(checkpoint_cost_s=CHECKPOINT_STALL_S, nodes=NODES, node_mtbf_h=node_mtbf_h).daly_interval_s
    base = dict(nodes=NODES, failures_per_1000_node_days=FAILURES_PER_1000_NODE_DAYS, work_days=WORK_DAYS,
                checkpoint_s=CHECKPOINT_STALL_S, requeue_s=REQUEUE_S, spare_nodes=SPARES)
    snapshots = dict(snapshot_interval_s=every * step_s, snapshot_s=stall_s, replication_s=replication_s)
    rows = [
        (f"checkpoints alone, every {daly_s / 60:.1f} min (Daly)",
         Scenario(checkpoint_interval_s=daly_s, restart_s=DEFAULT_RESTART_IN_ALLOCATION_S + disk_restore_s, **base)),
        (f"+ snapshots every {every} steps, checkpoints every {daly_s / 60:.1f} min",
         Scenario(checkpoint_interval_s=daly_s, restart_s=DEFAULT_RESTART_IN_ALLOCATION_S + peer_restore_s,
                  **base, **snapshots)),
        (f"+ snapshots every {every} steps, checkpoints every {LONG_CHECKPOINT_INTERVAL_S / 60:.0f} min",
         Scenario(checkpoint_interval_s=LONG_CHECKPOINT_INTERVAL_S,
                  restart_s=DEFAULT_RESTART_IN_ALLOCATION_S + peer_restore_s, **base, **snapshots)),
    ]
    print(f"goodput, {NODES * 8:,} GPUs ({NODES} nodes), {FAILURES_PER_1000_NODE_DAYS:g} failures per 1,000 "
          f"node-days, {SPARES} spares, {WORK_DAYS:g}-day runs x {TRIALS}, steps of {step_s:g} s, checkpoint "
          f"stall {CHECKPOINT_STALL_S:g} s:")
    lost = []
    for label, scenario in rows:
        summary = simulate(scenario, TRIALS, seed=1)
        per_failure_steps = summary.lost_h_mean * 3600.0 / max(summary.failures_mean, 1e-9) / step_s
        lost.append(per_failure_steps)
        print(f"  {label}: ETTR {summary.ettr_mean:.1%}, without a person {summary.finished_without_person:.0%}, "
              f"{per_failure_steps:.0f} steps lost per failure ({summary.failures_mean:.0f} failures a run)")
    print(f"steps lost per failure, snapshots / checkpoints alone: {lost[1]:.0f} / {lost[0]:.0f} "
          f"(a failure the spares or a restart in place absorb loses half a snapshot interval plus the "
          f"replication; a requeue or silent data corruption goes back to the checkpoint)")
