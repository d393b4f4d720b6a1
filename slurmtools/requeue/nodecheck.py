"""Is a silent node dead? Asked from outside the job: does its slurmd accept a connection.

Ranks that stop beating may only be stuck on a slow filesystem; a node whose slurmd does not
answer either is gone (the same question Slurm asks, without waiting SlurmdTimeout for it).
"""
from __future__ import annotations

import socket

from slurmtools import slurm
from slurmtools.errors import SlurmCommandError

CONNECT_TIMEOUT_S = 2.0


def slurmd_answers(node: str, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """True when the node's slurmd accepts a TCP connection (or when we cannot tell: the
    controller did not say where it listens, so no death is declared on our own guess)."""
    try:
        address, port = slurm.slurmd_endpoint(node)
    except SlurmCommandError:
        return True
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return True
    except OSError:
        return False
