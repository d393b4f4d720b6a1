#!/usr/bin/env python3
"""Debian roots for other Slurm releases: build time and size per release, and the cost of
running one program through the root (`in-root slurmd -V`, which needs no slurm.conf) against the
machine's own.

Run as root: .venv/bin/python bench/roots.py [--releases 24.11 26.05] [--samples 2]
Builds into a scratch dir (needs mmdebstrap and the machine's apt mirror), removes it at the end.
Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from slurmtools.minicluster import debroot, release
from slurmtools.minicluster.layout import MiniClusterLayout


def tree_size_mb(root: Path) -> float:
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total / 1e6


def timed_s(argv: list) -> float:
    start = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True, stdin=subprocess.DEVNULL)
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--releases", nargs="+", default=[r for r in release.RELEASES if r != debroot.host_release()])
    parser.add_argument("--samples", type=int, default=2)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="slurmtools-bench-roots-", dir="/var/tmp"))
    try:
        for name in args.releases:
            builds, sizes = [], []
            for sample in range(args.samples):
                root = scratch / name / "slurm-root"
                start = time.monotonic()
                debroot.build_root(root, name)
                builds.append(time.monotonic() - start)
                sizes.append(tree_size_mb(root))
                if sample < args.samples - 1:
                    shutil.rmtree(root)
            layout = MiniClusterLayout(state_dir=scratch / name, slurm_release=name)
            debroot.write_wrappers(layout)
            in_root = [timed_s([str(layout.bin_dir / "in-root"), "/usr/sbin/slurmd", "-V"]) for _ in range(5)]
            print(f"Slurm {name} ({release.RELEASES[name].suite}): build {statistics.median(builds):.1f} s "
                  f"(min {min(builds):.1f}, max {max(builds):.1f}, {len(builds)} builds), "
                  f"size {statistics.median(sizes):.0f} MB; `in-root slurmd -V` "
                  f"{statistics.median(in_root) * 1000:.0f} ms median")
        if shutil.which("slurmd"):
            own = [timed_s(["slurmd", "-V"]) for _ in range(5)]
            print(f"the machine's own `slurmd -V`: {statistics.median(own) * 1000:.0f} ms median")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
