"""Heartbeat watchdog: read the ranks' heartbeats (a file per rank, or per node: node_beat) and
find a stall and its laggard.

A rank that hangs stops before announcing its next step, while the others announce it and
then block inside a collective: the laggard is the rank with the lowest step. Deciding on a
stall is pure (`judge`); reading the files is `read_heartbeats`.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from slurmtools.common.control_dir import HEARTBEAT_DIR
from slurmtools.common.fsutil import read_small_regular
from slurmtools.train.node_beat import MAX_RANK_RECORD_BYTES, MAX_RANKS_PER_NODE, NODE_FILE_PREFIX


@dataclass(frozen=True)
class Beat:
    rank: int
    host: str
    step: int
    time_s: float
    first_progress_s: Optional[float] = None   # when this rank first completed a step this attempt
    alive_s: Optional[float] = None            # last sign of life (refreshed while in a collective)
    attempt_id: str = ""
    busy_s: Optional[float] = None             # local compute so far (TrainingControl.busy), for stragglers
    phase: str = ""                            # TrainingControl.phase: "saving", "verifying" (between steps)
    phase_until_s: Optional[float] = None      # the phase's own deadline; None: in no phase
    phase_t_s: Optional[float] = None          # when this rank last began or ended a phase

    @property
    def last_alive_s(self) -> float:
        return max(self.time_s, self.alive_s or 0.0)

    @property
    def last_work_s(self) -> float:
        """The step's time or, when later, the last phase change: a rank that just finished a
        20-minute save has not been idle for 20 minutes."""
        return max(self.time_s, self.phase_t_s or 0.0)


def first_progress(beats: List[Beat]) -> Optional[float]:
    """When the attempt's first step was done (the earliest rank), for goodput."""
    return min((b.first_progress_s for b in beats if b.first_progress_s is not None), default=None)


def last_progress(beats: List[Beat]) -> Optional[float]:
    """When the attempt's newest step was done (the last rank to finish it): the moment a failure
    that followed cost training, for the restart latency in goodput."""
    top = max((b.step for b in beats if b.first_progress_s is not None), default=None)
    return max((b.time_s for b in beats if b.step == top and b.first_progress_s is not None), default=None)


@dataclass(frozen=True)
class Stall:
    idle_s: float
    rank: Optional[int]     # the laggard, when exactly one rank is behind
    host: Optional[str]
    step: int
    detail: str = ""        # how the laggard was found, when not by its step (flight recorder)
    cut_off: Tuple[str, ...] = ()   # nodes whose slurmd did not answer: lost to the job (cut_off)


MAX_HEARTBEAT_BYTES = MAX_RANK_RECORD_BYTES       # one rank's record, in its own file or in its node's
MAX_NODE_HEARTBEAT_BYTES = MAX_HEARTBEAT_BYTES * MAX_RANKS_PER_NODE
# a heartbeat from the future hides a hang for as long as it is "new": allow only clock skew
FUTURE_TOLERANCE_S = 300.0
MAX_RANK = 1 << 20
MAX_STEP = 1 << 53
MAX_BUSY_S = 1e9
MAX_PHASE_S = 7 * 86400.0       # a phase deadline further out than this is not plausible
MAX_PHASE_NAME = 32


def parse_heartbeat(data: Any, now_s: float) -> Optional[Beat]:
    """One rank's heartbeat, or None when it is not a well-formed, plausible one. Written flat
    (exact JSON types, ranges that also refuse NaN and the infinities): the supervisor checks
    every rank's record every pass."""
    if type(data) is not dict:
        return None
    get = data.get
    rank: Any = get("rank")
    step: Any = get("step")
    time_s: Any = get("time")
    first: Any = get("first_progress_t")
    host: Any = get("host", "")
    alive: Any = get("alive")
    attempt: Any = get("attempt_id", "")
    busy: Any = get("busy_s")
    phase: Any = get("phase", "")
    until: Any = get("phase_until")
    phase_t: Any = get("phase_t")
    latest = now_s + FUTURE_TOLERANCE_S
    numbers = _NUMBER_TYPES
    if type(rank) is not int or not 0 <= rank < MAX_RANK or type(step) is not int or not 0 <= step < MAX_STEP:
        return None
    if type(time_s) not in numbers or not 0 < time_s <= latest or type(host) is not str or type(attempt) is not str:
        return None
    if alive is not None and (type(alive) not in numbers or not 0 < alive <= latest):
        return None
    if first is not None and (type(first) not in numbers or not 0 < first <= latest):
        return None
    if busy is not None and (type(busy) not in numbers or not 0 <= busy < MAX_BUSY_S):
        return None
    if type(phase) is not str or len(phase) > MAX_PHASE_NAME:
        return None
    if phase_t is not None and (type(phase_t) not in numbers or not 0 < phase_t <= latest):
        return None
    if until is not None and (type(until) not in numbers or not 0 < until <= now_s + MAX_PHASE_S):
        return None
    return Beat(rank, host[:256], step, float(time_s), float(first) if first is not None else None,
                float(alive) if alive is not None else None, attempt[:256],
                float(busy) if busy is not None else None, phase if until is not None else "",
                float(until) if until is not None else None, float(phase_t) if phase_t is not None else None)


# exact types, not isinstance: JSON gives plain int, float and bool (a bool is no number here)
_NUMBER_TYPES = (int, float)


def scan_heartbeats(control_dir: Path, now_s: Optional[float] = None, attempt_id: Optional[str] = None
                    ) -> Tuple[List[Beat], int]:
    """(valid heartbeats by rank, number of invalid entries). An invalid one is no evidence:
    never fatal, never a hang, never a hidden hang. With attempt_id, a beat of another attempt
    (a straggling process of the step before) is left out, neither valid nor invalid."""
    now = time.time() if now_s is None else now_s
    heartbeat_dir = control_dir / HEARTBEAT_DIR
    beats: Dict[int, Beat] = {}
    invalid = 0
    try:
        entries = sorted(heartbeat_dir.iterdir()) if heartbeat_dir.is_dir() and not heartbeat_dir.is_symlink() else []
    except OSError:
        entries = []
    for path in entries:
        if not path.name.endswith(".json"):
            continue
        gathered = path.name.startswith(NODE_FILE_PREFIX)      # a node's ranks in one file (node_beat)
        raw = read_small_regular(path, MAX_NODE_HEARTBEAT_BYTES if gathered else MAX_HEARTBEAT_BYTES)
        try:
            data = json.loads(raw) if raw is not None else None
        except (ValueError, RecursionError):
            data = None
        records = data.get("ranks") if gathered and isinstance(data, dict) else [data]
        if not isinstance(records, list):
            invalid += 1
            continue
        for record in records:
            beat = parse_heartbeat(record, now)
            if beat is not None and attempt_id is not None and beat.attempt_id and beat.attempt_id != attempt_id:
                continue
            if beat is None or beat.rank in beats:
                invalid += 1
                continue
            beats[beat.rank] = beat
    return [beats[rank] for rank in sorted(beats)], invalid


def read_heartbeats(control_dir: Path) -> List[Beat]:
    return scan_heartbeats(control_dir)[0]


def judge(beats: List[Beat], now_s: float, timeout_s: float, expected_ranks: Optional[int] = None,
          first_step_timeout_s: float = 0.0) -> Optional[Stall]:
    """A stall when no rank has beaten for timeout_s (first_step_timeout_s, when longer, until a
    rank finished its first step of the attempt: compiling, warming up); the laggard when one rank
    is behind the rest. None while any rank is in a phase (a save, a verify) within that phase's
    own deadline."""
    if timeout_s <= 0 or not beats:
        return None
    if not any(beat.first_progress_s is not None for beat in beats):
        timeout_s = max(timeout_s, first_step_timeout_s)
    if any(beat.phase_until_s is not None and beat.phase_until_s > now_s for beat in beats):
        return None
    newest = max(beat.last_work_s for beat in beats)
    idle = now_s - newest
    if idle < timeout_s:
        return None
    steps: Dict[int, List[Beat]] = {}
    for beat in beats:
        steps.setdefault(beat.step, []).append(beat)
    low = min(steps)
    laggards = steps[low]
    if len(steps) > 1 and len(laggards) == 1:
        lag = laggards[0]
        return Stall(idle, lag.rank, lag.host, lag.step)
    hosts = {lag.host for lag in laggards}
    if len(steps) > 1 and len(hosts) == 1 and "" not in hosts:
        # a whole node behind (its 8 ranks on a GPU node): the node is the laggard
        ranks = ",".join(str(lag.rank) for lag in laggards)
        return Stall(idle, laggards[0].rank, laggards[0].host, low,
                     f"ranks {ranks} on {laggards[0].host} stopped at step {low}; the others went on")
    if expected_ranks is not None and len(beats) == expected_ranks - 1:
        # one rank never beat at all: it is the laggard, but its host is unknown
        missing = sorted(set(range(expected_ranks)) - {b.rank for b in beats})
        return Stall(idle, missing[0] if missing else None, None, low)
    return Stall(idle, None, None, low)


def not_started(beats: List[Beat], step_nodes: Sequence[str], launched_s: float, now_s: float,
                startup_timeout_s: float, joined_s: Optional[Dict[str, float]] = None) -> Optional[Stall]:
    """Ranks elsewhere beat, but none on some of the step's nodes startup_timeout_s after the
    launch (or after the node joined the step: joined_s, a spare that took a lost node's ranks in
    place): stuck before their TrainingControl (an import on a hung filesystem mount), while their
    peers wait in the rendezvous up to the collective timeout. The node is named when a minority
    of the step's nodes did not start (else what they share, the filesystem, is the suspect)."""
    if startup_timeout_s <= 0 or not beats or now_s - launched_s < startup_timeout_s:
        return None
    started = {beat.host for beat in beats}
    joined = joined_s or {}
    missing = [node for node in step_nodes
               if node not in started and now_s - joined.get(node, launched_s) >= startup_timeout_s]
    if not missing:
        return None
    named = missing[0] if 2 * len(missing) < len(step_nodes) else None
    return Stall(now_s - launched_s, None, named, min(beat.step for beat in beats),
                 f"no rank on {','.join(missing)} started (no heartbeat) {now_s - launched_s:.0f} s after the "
                 f"launch (startup_timeout_s {startup_timeout_s:g}); ranks on {len(started)} other node(s) did")


# a rank silent for less than this is not named by silent_rank: under load a keep-alive thread
# waits a few seconds for a core (HEARTBEAT_INTERVAL_S is 1 s)
SILENT_RANK_MIN_S = 5.0


def silent_rank(stall: Stall, beats: List[Beat], now_s: float) -> Stall:
    """A stall nobody explains by step or by the flight recorders, in which the ranks of one node
    show no life (their keep-alive thread stopped: the process is stopped, or stuck holding the
    GIL, so it wrote no record either) while the others' keep-alives go on: that node's first
    such rank is named. Silent: for half the stall's idle time and SILENT_RANK_MIN_S at least,
    the others fresher than that; a minority of the ranks (a majority silent says more about the
    file system or our own node)."""
    if stall.rank is not None or stall.host is not None or not beats:
        return stall
    quiet_s = max(SILENT_RANK_MIN_S, stall.idle_s / 2)
    silent = sorted((beat for beat in beats if now_s - beat.last_alive_s >= quiet_s), key=lambda beat: beat.rank)
    hosts = {beat.host for beat in silent}
    if not silent or 2 * len(silent) >= len(beats) or len(hosts) != 1 or "" in hosts:
        return stall
    ranks = ",".join(str(beat.rank) for beat in silent)
    return replace(stall, rank=silent[0].rank, host=silent[0].host,
                   detail=f"rank{'s' if len(silent) > 1 else ''} {ranks} on {silent[0].host} showed no life for "
                          f"{now_s - silent[0].last_alive_s:.0f} s while the others waited at step {stall.step}")


def grace_expired(now_s: float, requested_s: float, grace_s: float, end_s: Optional[float],
                  beats: Sequence[Beat]) -> bool:
    """A requested checkpoint's grace (checkpoint_grace_s) is over: past grace_s since the request,
    unless some rank is still saving within its save's own deadline and the job's end is further off
    than the grace (a straggler swap, a warning that came early: the save may finish; a save that
    truly hangs still meets its phase's deadline, then the hang watch)."""
    if now_s - requested_s <= grace_s:
        return False
    saving = any(beat.phase == "saving" and beat.phase_until_s is not None and beat.phase_until_s > now_s
                 for beat in beats)
    return not (saving and (end_s is None or end_s - now_s > grace_s))


def minority_unreachable(unreachable: Sequence[str], step_nodes: int) -> bool:
    """Some of the step's nodes do not answer, but fewer than half: they are the ones lost. A
    majority unreachable says more about our own node (its network), so nobody is named."""
    return bool(unreachable) and 2 * len(unreachable) < step_nodes


def lost_for_sure(unreachable: Sequence[str], job_nodes: int, controller_answers: Callable[[], bool]) -> bool:
    """Whether nodes whose slurmd does not answer (twice) are lost: a minority of the job's nodes;
    or more (a job of two or three losing nodes together) when the controller answers us, so our
    own network is sound. A blip at our own node makes every node look dead, and it cuts us off
    from the controller too: then nobody is named (the whole job would be excluded). The
    controller is asked only when the minority rule cannot decide."""
    if not unreachable:
        return False
    return minority_unreachable(unreachable, job_nodes) or controller_answers()


def cut_off(stall: Stall, beats: List[Beat], unreachable: List[str], step_nodes: int) -> Stall:
    """A stall nobody explains (every rank alive at the same step) while the slurmd of a minority
    of the step's nodes does not answer: those nodes are cut off from the others (a partition;
    their ranks may go on beating on a filesystem reached another way) and the first is named.
    A majority unreachable says more about our own node: nobody is named."""
    if stall.rank is not None or stall.host is not None or not minority_unreachable(unreachable, step_nodes):
        return stall
    node = unreachable[0]
    ranks = sorted(beat.rank for beat in beats if beat.host == node)
    return replace(stall, rank=ranks[0] if ranks else None, host=node, cut_off=tuple(unreachable),
                   detail=f"every rank stopped at step {stall.step} and the slurmd of {','.join(unreachable)} does "
                          f"not answer: cut off from the other nodes")


def silent_step_nodes(beats: List[Beat], nodes: List[str], since_s: float, now_s: float,
                      timeout_s: float, joined_s: Optional[Dict[str, float]] = None) -> List[Tuple[str, float]]:
    """(host, silent seconds) of each of the step's nodes none of whose ranks has shown life for
    timeout_s, most silent first; a node none of whose ranks ever beat is silent since since_s
    (the step's launch: a node that dies during start-up never beats at all), or since it joined
    the step (joined_s: a spare whose ranks replaced a lost node's). Silence alone is no death (a
    stuck filesystem silences every node; the survivors of a dead peer may have exited): the
    supervisor asks the node's slurmd next."""
    if timeout_s <= 0:
        return []
    newest: Dict[str, float] = {node: (joined_s or {}).get(node, since_s) for node in nodes}
    for beat in beats:
        if beat.host in newest:
            newest[beat.host] = max(newest[beat.host], beat.last_alive_s)
    silent = [(host, now_s - t) for host, t in sorted(newest.items()) if now_s - t >= timeout_s]
    return sorted(silent, key=lambda item: -item[1])


def node_timeout_s(configured_s: int, step_times_s: List[float]) -> float:
    """The configured node timeout, or 4x the median step time and at least 10 s."""
    if configured_s > 0:
        return float(configured_s)
    return max(10.0, 4 * statistics.median_high(step_times_s)) if step_times_s else 10.0
