#!/usr/bin/env python3
"""Worked example: the tiny FSDP2 trainer on 2 nodes x 2 tasks through submitit, from Python.

The script form of examples/notebook_fsdp.ipynb (the same cells). It uses the same job spec rules
as the sbatch path; on the mini-cluster:  .venv/bin/python examples/notebook_fsdp.py
"""
from __future__ import annotations

import argparse
from pathlib import Path

from slurmtools import notebook
from slurmtools.notebook import TinyFSDPJob
from slurmtools.notebook_view import show_report, watch
from slurmtools.tiny_fsdp import TrainConfig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="runs/notebook-fsdp")
    ap.add_argument("--steps", type=int, default=24)
    args = ap.parse_args()
    work = Path(args.workdir).resolve()

    # %% the job, described once (a dict here; a YAML path works the same way)
    spec = {"name": "notebook-fsdp", "nodes": 2, "processes_per_node": 2, "time_limit_min": 15,
            "checkpoint_dir": str(work / "ckpt"), "requeue": {"warning_lead_s": 120, "checkpoint_grace_s": 60}}
    ex = notebook.executor(spec, folder=work / "submitit" / "%j")

    # %% submit the checkpointable trainer (its checkpoints go to the spec's checkpoint_dir)
    job = ex.submit(TinyFSDPJob(TrainConfig(steps=args.steps, checkpoint_every=6)))
    print(f"submitted job {job.job_id}")

    # %% watch it (one status line, redrawn in place)
    watch(job, spec)

    # %% the report (text here; the HTML page with plots in a notebook)
    show_report(job, spec)

    # %% the result (rank 0's) and the status with goodput
    result = job.results()[0]   # one result per task; rank 0 first
    print(notebook.status(job, spec, tail_lines=3))
    print(f"final step {result['step']}, state sha256 {result['state_sha256'][:16]}...")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
