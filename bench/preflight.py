#!/usr/bin/env python3
"""Preflight figures on a 3-node mini-cluster: wall time and false positives over repeated
healthy runs (the done-when: none in 20), then the slow-link and slow-node cases (rounds and
time until the node is named), then the in-training SDC canary's cost (bench/sdc.py).

Run as root: .venv/bin/python bench/preflight.py [--healthy 20]. Uses its own named cluster
(bench) and tears it down at the end. Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

from slurmtools.minicluster import cluster as mc
from slurmtools.minicluster import faults
from slurmtools.slurm import commands as slurm

REPO = Path(__file__).resolve().parent.parent
SLURMTOOLS = [sys.executable, "-m", "slurmtools"]


def preflights(work: Path, count: int) -> List[Dict[str, Any]]:
    """`slurmtools preflight` count times in one 3-node allocation; the verdict lines."""
    out = work / f"preflight-{time.time_ns()}.out"
    script = work / "preflight.sh"
    script.write_text("#!/bin/bash\n"
                      f"for i in $(seq {count}); do {' '.join(SLURMTOOLS)} preflight --report-dir {work}; done\n")
    job = int(slurm.run_slurm(["sbatch", "--parsable", "-N3", f"--output={out}", f"--chdir={REPO}", str(script)])
              .strip().split(";")[0])
    deadline = time.time() + 120 + 60 * count
    while not slurm.job_state(job).finished:
        if time.time() > deadline:
            raise SystemExit(f"job {job} did not finish")
        time.sleep(1)
    verdicts = []
    for line in out.read_text().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("slurmtools") == "preflight":
                verdicts.append(record)
    return verdicts


def show_fault(label: str, verdicts: List[Dict[str, Any]]) -> None:
    verdict = verdicts[-1]
    print(f"{label}: named {verdict.get('named')} by "
          f"{[f['test'] for f in verdict.get('findings', []) if f['node']]} in {verdict.get('wall_s')} s, "
          f"{verdict.get('rounds')} pair rounds")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--healthy", type=int, default=20)
    args = ap.parse_args()
    layout = mc.layout_for_up("bench", None, nodes=3, gpus_per_node=0, prolog_dir=REPO / "prolog.d",
                              epilog_dir=REPO / "epilog.d")
    os.environ["SLURM_CONF"] = str(layout.slurm_conf)
    mc.down(layout, purge=True)
    mc.up(layout, install=True, wait_s=90)
    try:
        with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
            work = Path(tmp)
            work.chmod(0o755)
            healthy = preflights(work, args.healthy)
            walls = [v["wall_s"] for v in healthy if "wall_s" in v]
            false = [v for v in healthy if v["status"] != "passed"]
            print(f"healthy: {len(healthy)} preflights on 3 nodes, {len(false)} not passed "
                  f"({[v.get('findings') for v in false]}); wall median {statistics.median(walls):.2f} s, "
                  f"max {max(walls):.2f} s")
            faults.degrade_node(layout, "node2", rate_mbit=100)
            show_fault("slow link (node2 at 100 Mbit/s)", preflights(work, 1))
            faults.heal_node(layout, "node2")
            faults.degrade_node(layout, "node2", cpu_percent=15)
            show_fault("slow node (node2 at 15% of a core)", preflights(work, 1))
            faults.heal_node(layout, "node2")
    finally:
        mc.down(layout, purge=True)
    print("in-training SDC canary (bench/sdc.py):", flush=True)
    subprocess.run([sys.executable, str(REPO / "bench" / "sdc.py")], check=False)


if __name__ == "__main__":
    main()
