"""Run a system (non-Slurm-client) command for the mini-cluster, with a timeout and a clear error."""
from __future__ import annotations

import os
import subprocess
from typing import Mapping, Optional, Sequence

from slurmtools.errors import MiniClusterError


def run(argv: Sequence[str], *, timeout_s: float = 60.0, check: bool = True,
        env: Optional[Mapping[str, str]] = None, input_text: Optional[str] = None) -> "subprocess.CompletedProcess[str]":
    """Run argv (never through a shell); raise MiniClusterError with argv and stderr on failure."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                              env=dict(env) if env is not None else None, input=input_text,
                              stdin=None if input_text is not None else subprocess.DEVNULL)
    except FileNotFoundError as exc:
        raise MiniClusterError(f"{argv[0]}: command not found") from exc
    except subprocess.TimeoutExpired as exc:
        raise MiniClusterError(f"{' '.join(argv)} timed out after {timeout_s:g} s") from exc
    if check and proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip().splitlines()
        raise MiniClusterError(f"{' '.join(argv)} exited {proc.returncode}" + (f": {err[-1]}" if err else ""))
    return proc


def require_root() -> None:
    if os.geteuid() != 0:
        raise MiniClusterError("the mini-cluster needs root (namespaces, daemons, cgroups); run it as root")
