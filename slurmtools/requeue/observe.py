"""What the supervisor learns from the ranks while a step runs, beyond a hang's step count:
straggler windows (reported in the job's output and the ledger; a straggler to swap out), and
flight-recorder dumps naming the rank that never entered a collective. The decisions are pure
(straggler.py, flightrec.py); this is their I/O: the control dir, the ledger, the event lines.
"""
from __future__ import annotations

import re
import time
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from slurmtools.common import ledger
from slurmtools.common.control_dir import REQUEST_FILE, TERM_FILE
from slurmtools.common.fsutil import write_json_atomic
from slurmtools.requeue import flightrec, nodecheck, straggler, watchdog
from slurmtools.requeue.actions import emit
from slurmtools.train.fr_dump import Reduced


def record_term(control: Path, attempt_id: str, now: float) -> None:
    """Slurm's SIGTERM came: say so in the control dir at once, durably, before any save is asked
    for (runtime.TERM_FILE): KillWait may kill the supervisor before the attempt's end is recorded."""
    try:
        write_json_atomic(control / TERM_FILE, {"t": now, "attempt_id": attempt_id})
    except OSError as exc:
        emit("control_error", attempt_id, error=f"cannot write {TERM_FILE}: {exc}")
    emit("term_received", attempt_id)


def request_checkpoint(control: Path, attempt_id: str, now: float, **why: object) -> None:
    """Every rank checkpoints at its next step boundary and exits (runtime.REQUEST_FILE)."""
    try:
        write_json_atomic(control / REQUEST_FILE, {"t": now, **why}, durable=False)
    except OSError as exc:
        emit("control_error", attempt_id, error=f"cannot write {REQUEST_FILE}: {exc}")
    emit("checkpoint_requested", attempt_id, **why)


def watch_stragglers(control: Path, attempt_id: str, stragglers: straggler.StragglerWatch,
                     beats: List[watchdog.Beat], can_swap: Callable[[str], bool], reported: List[str]
                     ) -> Optional[straggler.Straggler]:
    """Report each closed window (output; ledger when a node is slow); a straggler to swap out."""
    window = stragglers.observe(beats)
    if window is None:
        return None
    found = stragglers.straggler()
    action = "" if found is None or found.node in reported else ("swap" if can_swap(found.node) else "report")
    emit("slowdown", attempt_id, steps=[window.first_step, window.last_step], slowdown=window.slowdown,
         busy_per_step_s={node: round(value, 6) for node, value in window.busy_per_step_s.items()})
    slow = {node: value for node, value in window.slowdown.items() if value >= stragglers.factor}
    if slow or action:          # only the slow nodes: a record stays small on thousands of nodes
        ledger.append(control, ledger.NodeSlowdown(
            attempt_id, time.time(), window.first_step, window.last_step, slow,
            found.node if found is not None and action else None, action))
    if found is None or not action:
        return None
    reported.append(found.node)
    emit("straggler", attempt_id, node=found.node, slowdown=found.slowdown, windows=found.windows,
         action=action)
    return found if action == "swap" else None


class DumpRequest:
    """A hang no single rank explains: the flight recorders are asked once (and, with a node
    watch, every slurmd of the step probed in its threads), and the supervisor's loop goes on (a
    warning or a dead node is still handled within a pass) while they write; the stall is settled
    on the pass that finds every dump and probe, or when the wait is over (flightrec.dump_wait_over:
    no new record for DUMP_WAIT_S, DUMP_WAIT_MAX_S at most): named by the dumps, else by a node's
    ranks that show no life (watchdog.silent_rank), else by the nodes cut off (watchdog.cut_off),
    else unattributed."""

    def __init__(self, control: Path, attempt_id: str, recorder_dir: Optional[Path],
                 node_watch: Optional[nodecheck.NodeWatch] = None) -> None:
        self.control, self.attempt_id, self.recorder_dir = control, attempt_id, recorder_dir
        self.node_watch = node_watch
        self.asked_at: Optional[float] = None
        self.reach: "Optional[Future[List[str]]]" = None
        self.there = 0                                # ranks with a record or dump so far
        self.arrived_at: Optional[float] = None       # when that count last grew

    def settle(self, stall: Optional[watchdog.Stall], beats: List[watchdog.Beat], now: float
               ) -> Optional[watchdog.Stall]:
        """The stall to act on now (attributed where the dumps or probes say), or None: not yet."""
        if stall is None:
            self.asked_at, self.reach, self.there, self.arrived_at = None, None, 0, None
            return None
        nothing_to_ask = self.recorder_dir is None and self.node_watch is None
        if stall.rank is not None or stall.host is not None or not beats or nothing_to_ask:
            return stall
        if self.asked_at is None:
            self.asked_at = now
            asked = self.recorder_dir is not None and flightrec.request_dumps(self.control)
            if self.node_watch is not None:
                self.reach = self.node_watch.pool.submit(self.node_watch.unreachable)
            if asked or self.reach is not None:
                return None
        summaries: Dict[int, Reduced] = {}
        if self.recorder_dir is not None:
            summaries, ranks = flightrec.records_there(self.recorder_dir)
            if len(ranks) > self.there:
                self.there, self.arrived_at = len(ranks), now
        waiting = ((self.recorder_dir is not None and self.there < len(beats))
                   or (self.reach is not None and not self.reach.done()))
        if waiting and not flightrec.dump_wait_over(self.asked_at, self.arrived_at, now):
            return None
        if self.recorder_dir is not None:
            dumps = flightrec.read_reduced(self.recorder_dir, summaries=summaries)
            stall = attributed(stall, self.attempt_id, dumps, beats)
        stall = watchdog.silent_rank(stall, beats, now)
        if self.node_watch is not None and self.reach is not None and self.reach.done():
            stall = watchdog.cut_off(stall, beats, self.reach.result(), len(self.node_watch.candidates) + 1)
        return stall


def attributed(stall: watchdog.Stall, attempt_id: str, dumps: Dict[int, Reduced],
               beats: List[watchdog.Beat]) -> watchdog.Stall:
    """Every rank is at the same step: the flight recorders may still say which one never
    entered the collective the others wait in."""
    found = flightrec.laggard(dumps, {beat.rank: beat.host for beat in beats})
    emit("flight_recorder", attempt_id, dumps=len(dumps), ranks=len(beats),
         laggard=found.rank if found else None, detail=found.detail if found else None)
    return replace(stall, rank=found.rank, host=found.host, detail=found.detail) if found else stall


def collective_laggard(recorder_dir: Optional[Path], beats: List[watchdog.Beat]) -> Optional[flightrec.Laggard]:
    """After a failed step: the laggard named by the dumps torch wrote (an NCCL timeout), if any."""
    if recorder_dir is None:
        return None
    return flightrec.laggard(flightrec.read_reduced(recorder_dir), {beat.rank: beat.host for beat in beats})


_LAUNCH_FAILED_ON = re.compile(r"(?:failed on node|Node failure on) (\S+?)[:,]?\s")


def lost_with_step(node_watch: nodecheck.NodeWatch, exit_code: Optional[int], tail: str
                   ) -> Optional[Tuple[Tuple[str, ...], str]]:
    """After a step failed on its own (a non-zero exit we did not cause): the nodes that went with
    it, and the detail. Slurm needs SlurmdTimeout to notice a dead node and the ranks may not have
    beaten yet (a node lost while the step launches: srun's "Task launch ... failed on node X"),
    so each slurmd of the step is asked now (twice: NodeWatch.unreachable). Nodes lost for sure
    (watchdog.lost_for_sure: a minority of the job's) are named, the one srun named first; a
    majority says more about our own node."""
    if exit_code in (None, 0):
        return None
    gone = node_watch.unreachable()
    if not watchdog.lost_for_sure(gone, node_watch.job_nodes, node_watch.controller_answers):
        return None
    named = [match.group(1) for match in _LAUNCH_FAILED_ON.finditer(tail) if match.group(1) in gone]
    first = named[0] if named else gone[0]
    rest = tuple(node for node in gone if node != first)
    return (first, *rest), (f"the step failed (exit {exit_code}) and the slurmd of {','.join((first, *rest))} "
                            f"does not answer")


# the supervisor's share of one core at most: at 8,000 ranks one pass over the heartbeats takes
# ~0.1-0.2 s (bench/scale.py), so a fixed 0.5-s sleep would make it a third of a core or more
MAX_SUPERVISOR_CPU_SHARE = 0.1


def pace_s(poll_s: float, pass_s: float) -> float:
    """How long to sleep after a pass that took pass_s of CPU time: poll_s, or longer where the
    passes are long, so they take at most MAX_SUPERVISOR_CPU_SHARE of a core. CPU time, not wall
    time: on a busy node a pass waits for a core (128 ranks starting on 2 cores made a 10-ms pass
    last seconds) and sleeping 9x its wall time left the job unwatched for a minute."""
    return max(poll_s, pass_s * (1 - MAX_SUPERVISOR_CPU_SHARE) / MAX_SUPERVISOR_CPU_SHARE)
