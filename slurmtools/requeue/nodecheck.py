"""Is a silent node dead? Asked from outside the job: does its slurmd accept a connection.

Ranks that stop beating may only be stuck on a slow filesystem; a node whose slurmd does not
answer either is gone (the same question Slurm asks, without waiting SlurmdTimeout for it).
"""
from __future__ import annotations

import socket
from typing import Dict, List, Optional, Sequence

from slurmtools import slurm
from slurmtools.errors import SlurmCommandError
from slurmtools.requeue import watchdog

CONNECT_TIMEOUT_S = 2.0
PROBE_INTERVAL_S = 2.0


def slurmd_answers(address: str, port: int, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """True when the slurmd at address:port accepts a TCP connection."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return True
    except OSError:
        return False


class NodeWatch:
    """Node death in seconds: a node whose ranks are all silent past the node timeout and whose
    slurmd does not answer. Watched only when the allocation can go on without a node."""

    def __init__(self, node_timeout_s: int, nodes: Sequence[str], batch_host: Optional[str]) -> None:
        self.configured_s = node_timeout_s
        self.candidates = [node for node in nodes if node != batch_host]   # our own node dies with us
        self.step_times_s: List[float] = []
        self.last_step: Optional[int] = None
        self.last_change_t = 0.0
        self.probed_at: Dict[str, float] = {}
        self.endpoints: Dict[str, "tuple[str, int]"] = {}    # asked of the controller once per node

    def answers(self, node: str) -> bool:
        """Whether the node's slurmd answers (True when the controller cannot say where it listens:
        no death is declared on our own guess)."""
        if node not in self.endpoints:
            try:
                self.endpoints[node] = slurm.slurmd_endpoint(node)
            except SlurmCommandError:
                return True
        return slurmd_answers(*self.endpoints[node])

    def observe(self, beats: List[watchdog.Beat], now: float) -> None:
        """Step durations from how fast the slowest rank's step advances."""
        if not beats:
            return
        low = min(beat.step for beat in beats)
        if self.last_step is not None and low > self.last_step:
            self.step_times_s.append((now - self.last_change_t) / (low - self.last_step))
            self.step_times_s = self.step_times_s[-50:]
        if self.last_step is None or low != self.last_step:
            self.last_step, self.last_change_t = low, now

    def dead(self, beats: List[watchdog.Beat], now: float) -> "Optional[tuple[str, float, float]]":
        timeout = watchdog.node_timeout_s(self.configured_s, self.step_times_s)
        for host, silent_s in watchdog.silent_nodes(beats, now, timeout):
            if host not in self.candidates or now - self.probed_at.get(host, 0.0) < PROBE_INTERVAL_S:
                continue
            self.probed_at[host] = now
            if not self.answers(host):
                return host, silent_s, timeout
        return None
