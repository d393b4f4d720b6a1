#!/usr/bin/env python3
"""Mini-cluster figures: fresh bring-up, a second named cluster's bring-up beside the first,
status-poll cost with 1,000 queued jobs, sbatch -> running latency, node kill -> DOWN, requeue -> running.

Run as root: .venv/bin/python bench/minicluster.py [--samples 10]. Uses its own named clusters
(bench, bench2) and tears them down at the end. Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from slurmtools.minicluster import cluster as mc
from slurmtools.minicluster import faults
from slurmtools.minicluster.packages import missing_packages
from slurmtools.slurm import commands as slurm

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
    ap.add_argument("--queued", type=int, default=1000)
    args = ap.parse_args()
    for name in ("bench", "bench2"):
        mc.down(mc.find_layout(name, Path(f"/var/tmp/slurmtools-{name}-cluster")), purge=True)
    layout = mc.layout_for_up("bench", Path("/var/tmp/slurmtools-bench-cluster"), nodes=3, gpus_per_node=4,
                              prolog_dir=REPO / "prolog.d", epilog_dir=REPO / "epilog.d")
    installed = missing_packages()
    t0 = time.monotonic()
    mc.up(layout, install=True, wait_s=120)
    print(f"fresh bring-up (empty state{', with apt install' if installed else ', packages present'}): "
          f"{time.monotonic() - t0:.2f} s")
    second = mc.layout_for_up("bench2", Path("/var/tmp/slurmtools-bench2-cluster"), nodes=3, gpus_per_node=4,
                              prolog_dir=REPO / "prolog.d", epilog_dir=REPO / "epilog.d")
    t0 = time.monotonic()
    mc.up(second, install=False, wait_s=120)
    print(f"bring-up of a second named cluster while the first runs: {time.monotonic() - t0:.2f} s")
    mc.down(second, purge=True)
    os.environ["SLURM_CONF"] = str(layout.slurm_conf)
    try:
        poll_cost(args.queued)
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
        faults.kill_node(layout, "node2")
        down_s = wait(lambda: any(n.name == "node2" and n.state == "down" for n in slurm.nodes()), 90, 0.1)
        print(f"node kill -> node DOWN: {down_s:.1f} s (SlurmdTimeout=10, MessageTimeout=10)")
        wait(lambda: slurm.job_state(job).state == "PENDING", 60, 0.1)
        slurm.update_job(job, ReqNodeList="", ExcNodeList="node2")
        wait(lambda: running(job), 90, 0.1)
        print(f"node kill -> job running again on other nodes: {time.monotonic() - t_kill:.1f} s")
        slurm.cancel(job)
        faults.restart_node(layout, "node2")
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


def poll_cost(queued: int) -> None:
    """What one status poll costs with `queued` jobs pending: the old whole-queue JSON against
    the one-line `scontrol -o show job` slurmtools uses now."""
    slurm.submit("#!/bin/bash\n#SBATCH -N3 --exclusive -o /dev/null\nsleep 600\n")    # keeps the rest queued
    for _ in range(queued):
        slurm.run_slurm(["sbatch", "--parsable", "-N1", "-o", "/dev/null", "--wrap", "true"])
    target = slurm.submit("#!/bin/bash\n#SBATCH -N1 -o /dev/null\ntrue\n")
    for what, argv in (("squeue --json -j ID (whole queue on 22.05)", ["squeue", "--json", "-j", str(target)]),
                       ("scontrol -o show job ID (what status polls use)", ["scontrol", "-o", "show", "job", str(target)])):
        times, sizes = [], []
        for _ in range(10):
            t0 = time.monotonic()
            sizes.append(len(slurm.run_slurm(argv).encode()))
            times.append(time.monotonic() - t0)
        print(f"status poll with {queued} queued jobs, {what}: median {statistics.median(times) * 1000:.0f} ms, "
              f"{statistics.median(sizes)} bytes")
    slurm.run_slurm(["scancel", "--user=root"])
    wait(lambda: not slurm.run_slurm(["squeue", "-h", "-o", "%i"]).strip(), 120, 0.5)


if __name__ == "__main__":
    main()
