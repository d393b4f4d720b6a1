#!/usr/bin/env python3
"""How long a blamed node stays in service, on the real mini-cluster (root): a 2-node job with one
hot spare whose supervisor blames a node -- rank 3 computes wrong results (the SDC canary names
node2), or node2 is killed -- and reports it to the root-owned blame path. Per sample: seconds from
the supervisor's report to the node's DRAIN (the cluster's HealthCheckProgram, every 10 s, handles
it), and, in the same run, from the report to the job's first resumed step on the spare (the
drain must not delay the resume). Target: report -> DRAIN <= 15 s.

    .venv/bin/python bench/blame.py [--samples 3]   (brings its own cluster up and down)
Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.resume import events, finished, spec, submit, victim_of, wait  # noqa: E402
from slurmtools.minicluster import cluster as mc  # noqa: E402
from slurmtools.minicluster import faults  # noqa: E402
from slurmtools.slurm import drain, commands as slurm  # noqa: E402

STATE_DIR = Path("/var/tmp/slurmtools-bench-blame")


def one_sample(layout, work: Path, fault: str, index: int) -> Dict[str, float]:
    extra = ["--sdc-fault", "3:12", "--sdc-check-every", "3"] if fault == "sdc" else []
    s = spec(work, f"{fault}-{index}", extra, spare_nodes=1)
    job = submit(s)
    if fault == "node kill":
        wait(lambda: any(e.get("step", 0) >= 12 and "loss" in e for e in events(s, job)), 120, "step 12")
        faults.kill_node(layout, victim_of(s, job))
    blame = wait(lambda: next((e for e in events(s, job) if e.get("slurmtools") in ("blame", "blame_failed")), None),
                 300, "the supervisor's blame", interval_s=0.05)
    if blame["slurmtools"] == "blame_failed":
        raise SystemExit(f"the blame was not reported: {blame['error']}")
    node = blame["node"]
    drained = wait(lambda: next((time.time() for n in slurm.nodes(node) if n.drained), None), 60,
                   f"{node} drained", interval_s=0.05)
    wait(lambda: finished(job), 300, "the job")
    evts = events(s, job)
    resumed = next(e for e in evts if e.get("event") == "resumed" and e["t"] > blame["t"])
    first = next(e for e in evts if "loss" in e and e["t"] > resumed["t"])
    if fault == "node kill":
        faults.restart_node(layout, node)
    for n in slurm.nodes():
        if n.drained and drain.is_ours(n.reason):
            drain.resume(n.name)
    wait(lambda: all(n.state == "idle" and not n.flags for n in slurm.nodes()), 90, "nodes idle")
    return {"drain": drained - blame["t"], "resume": first["t"] - blame["t"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3)
    args = parser.parse_args()
    mc.down(mc.find_layout("blamebn", STATE_DIR), purge=True)
    layout = mc.layout_for_up("blamebn", STATE_DIR, nodes=3, gpus_per_node=4, prolog_dir=REPO / "prolog.d",
                              epilog_dir=REPO / "epilog.d")
    mc.up(layout, install=True, wait_s=120)
    os.environ["SLURM_CONF"] = str(layout.slurm_conf)
    work = Path(tempfile.mkdtemp(prefix="slurmtools-bench-blame-"))
    work.chmod(0o755)
    try:
        for fault in ("sdc", "node kill"):
            samples: List[Dict[str, float]] = [one_sample(layout, work, fault, i) for i in range(args.samples)]
            drains = [x["drain"] for x in samples]
            resumes = [x["resume"] for x in samples]
            print(f"{fault}: report -> DRAIN median {statistics.median(drains):.1f} s (max {max(drains):.1f}, "
                  f"{', '.join(f'{d:.1f}' for d in drains)}); report -> first resumed step on the spare median "
                  f"{statistics.median(resumes):.1f} s ({', '.join(f'{r:.1f}' for r in resumes)})", flush=True)
    finally:
        for job in slurm.run_slurm(["squeue", "-h", "-o", "%i"]).split():
            slurm.cancel(int(job))
        mc.down(layout, purge=True)


if __name__ == "__main__":
    if os.geteuid() != 0:
        raise SystemExit("bench/blame.py needs root (it runs the mini-cluster)")
    main()
