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


def first_worker_error(stderr: str) -> str:
    """A failed worker's own error (the first traceback in the output, up to its exception line),
    not torchrun's summary, which names the rank and exit code only; else the output's tail."""
    lines = stderr.splitlines()
    for start, line in enumerate(lines):
        if line.lstrip("[rank0123456789]: ").startswith("Traceback (most recent call last)"):
            for end in range(start + 1, len(lines)):
                text = lines[end].split("]:", 1)[-1] if lines[end].startswith("[rank") else lines[end]
                if text and not text[0].isspace():
                    return "\n".join(lines[max(start, end - 12):end + 1])
    return stderr[-2000:]


def run_under_torchrun(script: str, procs: int, args: List[str]) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs), script, *args]
    proc = subprocess.run(cmd, env=dict(os.environ, **{WORKER_ENV: "1"}), capture_output=True, text=True)
    out = "\n".join(ln for ln in proc.stdout.splitlines() if not ln.startswith("*") and "OMP_NUM_THREADS" not in ln)
    print(out, flush=True)
    if proc.returncode != 0:
        raise SystemExit(first_worker_error(proc.stderr))
    return out
