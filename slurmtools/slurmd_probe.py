"""Does a node's slurmd accept a connection? Asked from outside the node, without waiting
SlurmdTimeout for Slurm's own ping: by a job's supervisor (a silent node: dead or only slow?) and
by the root side of a blame (a node a job reported dead: released at once?)."""
from __future__ import annotations

import socket

CONNECT_TIMEOUT_S = 2.0


def slurmd_answers(address: str, port: int, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """True when the slurmd at address:port accepts a TCP connection."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return True
    except OSError:
        return False
