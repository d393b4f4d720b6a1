"""Benchmarks that run as torch.distributed workers launch themselves under torchrun: the
parent re-runs the script with WORKER_ENV set and prints the workers' lines (rank 0 prints)."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import List

WORKER_ENV = "SLURMTOOLS_BENCH_WORKER"


def is_worker() -> bool:
    return bool(os.environ.get(WORKER_ENV))


def run_under_torchrun(script: str, procs: int, args: List[str]) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs), script, *args]
    proc = subprocess.run(cmd, env=dict(os.environ, **{WORKER_ENV: "1"}), capture_output=True, text=True)
    out = "\n".join(ln for ln in proc.stdout.splitlines() if not ln.startswith("*") and "OMP_NUM_THREADS" not in ln)
    print(out, flush=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-2000:])
    return out
