#!/usr/bin/env python3
"""Wall time of a full prolog health run on a simulated 8-GPU + 8-HCA node (median of N).

Prints: the whole `slurmtools health run --phase prolog` process (what Slurm waits for), split into
start-up (interpreter + imports + config), probes and checks, measured in-process; then the same
with a prolog-cache hit. The GPU facts come from the recorded-format fixture `h100-8gpu` (no GPU
here): on a real node, NVML init and queries add their own time to "probes", which the cache skips.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slurmtools.health import config, gate, runner
from slurmtools.health.checks.ib import IbHistory
from slurmtools.health.fixture_data import kmsg_line, write_ib_tree

CONFIG = """defaults:
  gpu_probe: "fixture:h100-8gpu"
  sysfs_root: {root}
  kernel_log: {kmsg}
  state_dir: {state}
  syslog: false
  drain: false
  cache_minutes: {cache}
  checks:
    gpu:
      count: {{expected: 8}}
      pcie: {{expected_width: 16, expected_gen: 5}}
      nvlink: {{expected_active: 18}}
    ib:
      ports: {{expected_ports: 8, min_rate_gbps: 400, link_layer: InfiniBand}}
"""


def setup(tmp: Path, cache: float) -> Path:
    write_ib_tree(tmp / "root", 8)
    kmsg = tmp / "kmsg"
    kmsg.write_text("".join(kmsg_line(i, f"kernel line {i}") for i in range(2000)))
    cfg = tmp / f"health-{cache}.yaml"
    cfg.write_text(CONFIG.format(root=tmp / "root", kmsg=kmsg, state=tmp / f"state-{cache}", cache=cache))
    cfg.chmod(0o644)
    return cfg


def cli_run(cfg: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "slurmtools", "health", "run", "--phase", "prolog", "--config",
                           str(cfg), "--node", "gpu001", "--quiet"], capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"health run failed ({proc.returncode}): {proc.stderr.strip()}")
    return dt


def in_process(cfg: Path):
    """(probes_s, checks_s, total_s, cached) for one run, by phase."""
    s = config.load_config(str(cfg)).for_host("gpu001")
    t0 = time.perf_counter()
    out = gate.run_phase(s, "prolog", "gpu001", job_id=None, allow_drain=False)
    total = time.perf_counter() - t0
    deadline = time.monotonic() + s.deadline_s
    t1 = time.perf_counter()
    facts = runner.gather_cheap(s, "prolog", deadline)
    if not out.cached:
        runner.gather_gpu(s, "prolog", deadline, facts)
    else:
        facts.gpu_skipped = True
    t2 = time.perf_counter()
    runner.judge(s, "prolog", facts, after_kmsg_seq=-1, ib_history=IbHistory(), previous_nvlink=None)
    t3 = time.perf_counter()
    return t2 - t1, t3 - t2, total, out.cached


def report(label: str, cfg: Path, n: int) -> None:
    cli_run(cfg)  # warm the page cache and, for the cache case, record a clean pass
    walls = [cli_run(cfg) for _ in range(n)]
    parts = [in_process(cfg) for _ in range(n)]
    probes = statistics.median(p[0] for p in parts)
    checks = statistics.median(p[1] for p in parts)
    inproc = statistics.median(p[2] for p in parts)
    wall = statistics.median(walls)
    print(f"{label}: median {wall * 1000:.0f} ms per prolog (min {min(walls) * 1000:.0f}, max {max(walls) * 1000:.0f}, "
          f"n={n}); start-up {max(0.0, wall - inproc) * 1000:.0f} ms, probes {probes * 1000:.1f} ms, "
          f"checks {checks * 1000:.2f} ms, state+reports {max(0.0, inproc - probes - checks) * 1000:.1f} ms; "
          f"cache hit: {parts[-1][3]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        report("full prolog, 8 GPUs + 8 HCAs", setup(tmp, 0), args.n)
        report("with the prolog cache", setup(tmp, 10), args.n)


if __name__ == "__main__":
    main()
