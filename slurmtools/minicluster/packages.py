"""Debian packages the mini-cluster (and the tests' real Prometheus and Chromium) need:
installed only where missing, never starting a daemon while installing."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator, List, Tuple

from slurmtools.errors import MiniClusterError
from slurmtools.minicluster.layout import REQUIRED_PACKAGES


def missing_packages(packages: Tuple[str, ...] = REQUIRED_PACKAGES) -> List[str]:
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${db:Status-Abbrev}\n", *packages],
                         capture_output=True, text=True, stdin=subprocess.DEVNULL)
    installed = {ln.split()[0] for ln in out.stdout.splitlines() if len(ln.split()) > 1 and ln.split()[1] == "ii"}
    return [p for p in packages if p not in installed]


def install_packages(extra: Tuple[str, ...] = ()) -> List[str]:
    """Install Debian's Slurm, munge and MariaDB (and extra) only where missing (apt starts no daemon here)."""
    if not shutil.which("dpkg-query") or not shutil.which("apt-get"):
        raise MiniClusterError("apt-get/dpkg not found: the mini-cluster installs Debian packages (Debian 12 or newer)")
    missing = missing_packages(REQUIRED_PACKAGES + extra)
    if not missing:
        return []
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    with _no_daemon_starts():
        for argv in (["apt-get", "update", "-q"],
                     ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]):
            proc = subprocess.run(argv, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL,
                                  timeout=900)
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()
                raise MiniClusterError(f"{' '.join(argv[:3])} failed: {tail[-1] if tail else proc.returncode}")
    return missing


POLICY_RC_D = Path("/usr/sbin/policy-rc.d")


@contextlib.contextmanager
def _no_daemon_starts() -> Iterator[None]:
    """Packages install without starting their daemons (slurmctld, mariadb, prometheus would
    otherwise start system-wide on a machine with an init system): Debian's policy-rc.d
    convention, exit 101 = action forbidden. A machine's own policy-rc.d is left as it is."""
    if POLICY_RC_D.exists():
        yield
        return
    POLICY_RC_D.write_text("#!/bin/sh\n# slurmtools: no daemon starts while it installs packages\nexit 101\n")
    POLICY_RC_D.chmod(0o755)
    try:
        yield
    finally:
        POLICY_RC_D.unlink(missing_ok=True)
