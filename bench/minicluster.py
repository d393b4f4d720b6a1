#!/usr/bin/env python3
"""Mini-cluster figures: fresh bring-up, sbatch -> running latency, node kill -> DOWN, requeue -> running.

Run as root: .venv/bin/python bench/minicluster.py [--samples 10]. Uses its own state dir and
tears the cluster down at the end. Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from slurmtools import slurm
from slurmtools.minicluster import cluster as mc
from slurmtools.minicluster.layout import MiniClusterLayout

REPO = Path(__file__).resolve().parent.parent


def wait(pred, timeout_s: float, interval_s: float = 0.02) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if pred():
            return time.monotonic() - t0
        time.sleep(interval_s)
    raise SystemExit(f"timed out after {timeout_s} s")


def running(job: int) -> bool:
    return slurm.job_state(job).state == "RUNNING"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--state-dir", default="/var/tmp/slurmtools-bench-cluster")
    args = ap.parse_args()
    layout = MiniClusterLayout(state_dir=Path(args.state_dir), controller_host=mc.default_controller_host(),
                               prolog_dir=REPO / "prolog.d", epilog_dir=REPO / "epilog.d")
    mc.down(layout, purge=True)
    installed = mc.missing_packages()
    t0 = time.monotonic()
    mc.up(layout, install=True, wait_s=120)
    print(f"fresh bring-up (empty state{', with apt install' if installed else ', packages present'}): "
          f"{time.monotonic() - t0:.2f} s")
    try:
        lat = []
        for _ in range(args.samples):
            t0 = time.monotonic()
            job = slurm.submit("#!/bin/bash\n#SBATCH -N2 -o /dev/null\nsleep 30\n")
            wait(lambda: running(job), 30)
            lat.append(time.monotonic() - t0)
            slurm.cancel(job)
            wait(lambda: slurm.job_state(job).finished, 30)
        print(f"sbatch -> RUNNING, 2-node job: median {statistics.median(lat):.2f} s "
              f"(min {min(lat):.2f}, max {max(lat):.2f}, n={len(lat)})")

        job = slurm.submit("#!/bin/bash\n#SBATCH -N2 -w node[1-2] --requeue -o /dev/null\nsrun sleep 300\n")
        wait(lambda: running(job), 30)
        time.sleep(1)
        t_kill = time.monotonic()
        mc.kill_node(layout, "node2")
        down_s = wait(lambda: any(n.name == "node2" and n.state == "down" for n in slurm.nodes()), 90, 0.1)
        print(f"node kill -> node DOWN: {down_s:.1f} s (SlurmdTimeout=10, MessageTimeout=10)")
        wait(lambda: slurm.job_state(job).state == "PENDING", 60, 0.1)
        slurm.update_job(job, ReqNodeList="", ExcNodeList="node2")
        wait(lambda: running(job), 90, 0.1)
        print(f"node kill -> job running again on other nodes: {time.monotonic() - t_kill:.1f} s")
        slurm.cancel(job)
        mc.restart_node(layout, "node2")
        wait(lambda: all(n.state == "idle" for n in slurm.nodes()), 60)

        job = slurm.submit("#!/bin/bash\n#SBATCH -N2 --requeue -o /dev/null\nsrun sleep 300\n")
        wait(lambda: running(job), 30)
        t0 = time.monotonic()
        slurm.requeue(job)
        wait(lambda: slurm.job_state(job).state == "PENDING", 30)
        wait(lambda: running(job), 60, 0.1)
        print(f"scontrol requeue -> RUNNING again: {time.monotonic() - t0:.1f} s (floor: cred_expire=10 s + 1 s)")
        slurm.cancel(job)
    finally:
        mc.down(layout, purge=True)


if __name__ == "__main__":
    main()
