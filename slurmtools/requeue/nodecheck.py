"""Is a silent node dead? Asked from outside the job: does its slurmd accept a connection.

Ranks that stop beating may only be stuck on a slow filesystem; a node whose slurmd does not
answer either is gone (the same question Slurm asks, without waiting SlurmdTimeout for it). One
failed connect proves little (a dropped SYN, a blip at our own node): a node is declared dead
only when a second probe, CONFIRM_GAP_S or more later, fails too, and only when a minority of
the step's nodes fail them (a majority says more about our own node's network).
"""
from __future__ import annotations

import socket
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from slurmtools.errors import SlurmCommandError
from slurmtools.requeue import watchdog
from slurmtools.slurm import commands as slurm

CONNECT_TIMEOUT_S = 2.0
PROBE_INTERVAL_S = 2.0
PROBE_THREADS = 8
CONFIRM_GAP_S = 2.0          # between the two failed probes that declare a node dead


def slurmd_answers(address: str, port: int, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """True when the slurmd at address:port accepts a TCP connection."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return True
    except OSError:
        return False


@dataclass(frozen=True)
class Death:
    """The nodes found dead together: the first was silent past the timeout; every other node of
    the step whose slurmd did not answer either leaves with it."""
    nodes: Tuple[str, ...]
    silent_s: float
    timeout_s: float


class NodeWatch:
    """Node death in seconds: a node whose ranks are all silent past the node timeout (or never
    beat since the launch) and whose slurmd does not answer. The probes run in threads, so a
    node that does not answer never holds up the supervisor's loop (warning signals, hangs)."""

    def __init__(self, node_timeout_s: int, nodes: Sequence[str], batch_host: Optional[str],
                 launched_s: float, job_nodes: int = 0) -> None:
        self.configured_s = node_timeout_s
        self.step_nodes = list(nodes)
        self.candidates = [node for node in nodes if node != batch_host]   # our own node dies with us
        self.job_nodes = job_nodes or len(self.candidates) + 1    # the allocation's, spares and our own included
        self.controller_answers: Callable[[], bool] = slurm.ping   # the witness for a job of two (lost_for_sure)
        self.launched_s = launched_s
        self.step_times_s: List[float] = []
        self.last_step: Optional[int] = None
        self.last_change_t = 0.0
        self.probed_at: Dict[str, float] = {}
        self.probes: Dict[str, "Future[bool]"] = {}
        self.failed_since: Dict[str, float] = {}   # host -> when the first of its failed probes in a row began
        self.reprobe_after_s = CONFIRM_GAP_S        # unreachable(): the wait before the confirming probe
        self.endpoints: Dict[str, "tuple[str, int]"] = {}    # asked of the controller once per node
        self.pool = ThreadPoolExecutor(max_workers=PROBE_THREADS, thread_name_prefix="slurmd-probe")
        self.joined_s: Dict[str, float] = {}        # spares that replaced a lost node in place: since when

    def swap(self, lost: Sequence[str], spares: Sequence[str], now: float) -> None:
        """In-place recovery: the lost nodes leave the watch, the spares that took their ranks join
        it (silent since now, not since the step's launch)."""
        for node in lost:
            self.probes.pop(node, None)
            self.failed_since.pop(node, None)
        self.step_nodes = [node for node in self.step_nodes if node not in lost] + list(spares)
        self.candidates = [node for node in self.candidates if node not in lost] + list(spares)
        self.joined_s.update({node: now for node in spares})

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def resolve_endpoints(self) -> "Optional[Future[None]]":
        """Ask the controller now, while it answers (the step was just launched), where every
        node's slurmd listens: one query, in a probe thread. A node lost while the controller is
        down (an outage: failures come together) is then still found in seconds (R48: 95 s when
        the address was first asked once the node fell silent)."""
        if not self.candidates:
            return None
        from ClusterShell.NodeSet import NodeSet
        return self.pool.submit(self._resolve, str(NodeSet.fromlist(self.candidates)))

    def _resolve(self, hostlist: str) -> None:
        try:
            found = slurm.slurmd_endpoints(hostlist)
        except SlurmCommandError:
            return                              # asked again per node when one falls silent
        for node, endpoint in found.items():
            self.endpoints.setdefault(node, endpoint)

    def answers(self, node: str) -> bool:
        """Whether the node's slurmd answers (True when the controller cannot say where it listens:
        no death is declared on our own guess)."""
        if node not in self.endpoints:
            try:
                endpoint = slurm.slurmd_endpoints(node).get(node)
            except SlurmCommandError:
                return True
            if endpoint is None:
                return True
            self.endpoints[node] = endpoint
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

    def dead(self, beats: List[watchdog.Beat], now: float) -> Optional[Death]:
        """Start a probe of each silent node (at most one in flight per node, one per
        PROBE_INTERVAL_S); a Death once one did not answer twice CONFIRM_GAP_S apart, with every
        node of the step probed, when they are lost for sure (watchdog.lost_for_sure)."""
        timeout = watchdog.node_timeout_s(self.configured_s, self.step_times_s)
        silent = dict(watchdog.silent_step_nodes(beats, self.candidates, self.launched_s, now, timeout, self.joined_s))
        for host in silent:
            if host not in self.probes and now - self.probed_at.get(host, 0.0) >= PROBE_INTERVAL_S:
                self.probed_at[host] = now
                self.probes[host] = self.pool.submit(self.answers, host)
        found = []
        for host, probe in list(self.probes.items()):
            if probe.done():
                del self.probes[host]
                if _answered(probe) or host not in silent:
                    self.failed_since.pop(host, None)
                    continue
                began = self.failed_since.setdefault(host, self.probed_at[host])
                if self.probed_at[host] - began >= CONFIRM_GAP_S:      # a second failed probe, later
                    found.append(host)
        if not found:
            return None
        # a second node lost at the same moment need not be silent past the timeout yet: ask them all
        also = self.unreachable([node for node in self.candidates if node not in found])
        if not watchdog.lost_for_sure(found + also, self.job_nodes, self.controller_answers):
            return None          # most of the job unreachable: our own node's network, nobody named
        first = max(found, key=lambda host: silent[host])
        return Death((first, *sorted(set(found + also) - {first})), silent[first], timeout)

    def unreachable(self, nodes: Optional[Sequence[str]] = None) -> List[str]:
        """Of nodes (default: the step's, but our own), those whose slurmd does not answer now nor
        reprobe_after_s later: each round probed together (at most CONNECT_TIMEOUT_S + 1 s)."""
        first = self._probe_round(self.candidates if nodes is None else nodes)
        if not first:
            return first
        time.sleep(self.reprobe_after_s)
        return self._probe_round(first)

    def _probe_round(self, nodes: Sequence[str]) -> List[str]:
        probes = {node: self.pool.submit(self.answers, node) for node in nodes}
        wait(list(probes.values()), timeout=CONNECT_TIMEOUT_S + 1.0)
        return sorted(node for node, probe in probes.items() if probe.done() and not _answered(probe))


def silent_twice(endpoints: Dict[str, Tuple[str, int]]) -> List[str]:
    """Of these slurmds (node -> address, port), those that answer neither a connect now nor one
    CONFIRM_GAP_S later: what the judge asks of a node Slurm flags NOT_RESPONDING (one missed
    ping of a loaded node) before it takes the flag for a node failure."""
    first = _probe_all(endpoints, sorted(endpoints))
    if not first:
        return first
    time.sleep(CONFIRM_GAP_S)
    return _probe_all(endpoints, first)


def _probe_all(endpoints: Dict[str, Tuple[str, int]], nodes: Sequence[str]) -> List[str]:
    with ThreadPoolExecutor(max_workers=PROBE_THREADS, thread_name_prefix="slurmd-probe") as pool:
        answered = list(pool.map(lambda node: slurmd_answers(*endpoints[node]), nodes))
    return [node for node, answer in zip(nodes, answered) if not answer]


def _answered(probe: "Future[bool]") -> bool:
    """A probe that raised is no evidence of death."""
    try:
        return probe.result()
    except Exception:       # noqa: BLE001 - any failure of our own probe is no verdict on the node
        return True
