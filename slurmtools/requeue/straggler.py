"""Stragglers: a rank whose local compute per step stays above the other nodes' ranks', and the
node it runs on. Pure.

Collectives make every rank's step as long as the slowest rank's, so step times name no node.
What differs is the time each rank spends in work that waits for nobody: the trainer wraps it
in `TrainingControl.busy()` and its heartbeat carries the running total. Per window of
`window_steps` steps, each rank's busy time per step is compared with the median of the ranks on
the other nodes: judged per rank, since a node's mean dilutes one slow GPU (2x slow among 8 ranks
reads as 1.125x), and against the other nodes, since a whole slow node must not pull the median
it is judged by (on 2 nodes it would be half of it). A node's slowdown is its slowest rank's. A
rank at or above `factor` times that median, whose excess costs at least MIN_EXCESS_STEP_FRACTION
of the window's step (a floor relative to the step: 3 ms above a 3-ms optimizer step matter on a
60-ms step, not on a 5-s one; on a tiny step, scheduler noise alone reaches any factor) and at
least MIN_EXCESS_S (timer and scheduler granularity), for `windows` windows in a row makes its
node a straggler. Cost per window: O(ranks log ranks), one sort.
"""
from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from slurmtools.requeue.watchdog import Beat

MIN_EXCESS_STEP_FRACTION = 0.05
MIN_EXCESS_S = 0.002


@dataclass(frozen=True)
class Window:
    first_step: int
    last_step: int
    busy_per_step_s: Dict[str, float]       # node -> its slowest rank's busy seconds per step
    slowdown: Dict[str, float]              # node -> that / the median of the other nodes' ranks
    slowest_rank: Dict[str, int]            # node -> its slowest rank
    others_median_s: Dict[str, float]       # node -> the median it was compared with
    step_s: float = 0.0                     # wall seconds per step in the window (median over ranks)


@dataclass(frozen=True)
class Straggler:
    node: str
    slowdown: float                         # in the window that made it one
    windows: int
    rank: int = -1                          # its slowest rank

    @property
    def detail(self) -> str:
        """The evidence as it goes into the drain reason and the decision."""
        return f"node={self.node} slowdown={self.slowdown:.1f}x" + (f" rank={self.rank}" if self.rank >= 0 else "")


def median_without(ordered: Sequence[float], removed: Sequence[int]) -> float:
    """The median of ordered (ascending) without the entries at the positions removed
    (ascending, distinct, fewer than len(ordered)): O(len(removed) + log) per call, not a copy."""
    remaining = len(ordered) - len(removed)

    def nth(j: int) -> float:
        """The j-th smallest remaining entry: the first position where j + 1 are kept."""
        low, high = j, j + len(removed)
        while low < high:
            mid = (low + high) // 2
            if mid + 1 - bisect.bisect_right(removed, mid) >= j + 1:
                high = mid
            else:
                low = mid + 1
        return ordered[low]
    if remaining % 2:
        return nth(remaining // 2)
    return (nth(remaining // 2 - 1) + nth(remaining // 2)) / 2


def window_between(start: Dict[int, Beat], end: Dict[int, Beat]) -> Optional[Window]:
    """The window from one set of beats to a later one (by rank), or None when fewer than two
    nodes can be compared."""
    per_rank: List[Tuple[float, int, str]] = []
    step_s: List[float] = []
    for rank, first in start.items():
        last = end.get(rank)
        if last is None or first.busy_s is None or last.busy_s is None or last.step <= first.step or not last.host:
            continue
        steps = last.step - first.step
        per_rank.append((max(0.0, last.busy_s - first.busy_s) / steps, rank, last.host))
        step_s.append(max(0.0, last.time_s - first.time_s) / steps)
    per_rank.sort()
    positions: Dict[str, List[int]] = {}
    for position, (_, _, node) in enumerate(per_rank):
        positions.setdefault(node, []).append(position)
    if len(positions) < 2:
        return None
    ordered = [busy for busy, _, _ in per_rank]
    busy, slowdown, slowest, others = {}, {}, {}, {}
    for node in sorted(positions):
        mine = positions[node]
        value, rank, _ = per_rank[mine[-1]]                 # ascending: its last is its slowest
        median = median_without(ordered, mine)
        busy[node], slowest[node], others[node] = value, rank, median
        slowdown[node] = round(value / max(median, 1e-6), 3)
    first_steps = [beat.step for beat in start.values()]
    last_steps = [beat.step for beat in end.values()]
    return Window(min(first_steps), min(last_steps), busy, slowdown, slowest, others, statistics.median(step_s))


def excess_s(window: Window, node: str) -> float:
    """How many seconds per step node's slowest rank is above the other nodes' median."""
    return window.busy_per_step_s[node] - window.others_median_s[node]


def is_slow(window: Window, node: str, factor: float) -> bool:
    """Whether node's slowest rank is slow enough in this window to count towards a straggler."""
    floor_s = max(MIN_EXCESS_S, MIN_EXCESS_STEP_FRACTION * window.step_s)
    return window.slowdown[node] >= factor and excess_s(window, node) >= floor_s


class StragglerWatch:
    """Fed the heartbeats each time the supervisor reads them; says when a window closed and
    when a node has been slow for enough windows in a row."""

    def __init__(self, factor: float, windows: int, window_steps: int) -> None:
        self.factor = factor
        self.windows = windows
        self.window_steps = window_steps
        self._start: Dict[int, Beat] = {}
        self._slow_windows: Dict[str, int] = {}
        self._last: Optional[Window] = None

    def observe(self, beats: List[Beat]) -> Optional[Window]:
        """The window that closed with these beats, if one did."""
        timed = {beat.rank: beat for beat in beats if beat.busy_s is not None and beat.host}
        if not timed:
            return None
        if not self._start or set(timed) != set(self._start):
            self._start = timed                  # the first beats, or the ranks changed: start again
            return None
        if any(timed[rank].step < beat.step + self.window_steps for rank, beat in self._start.items()):
            return None
        window = window_between(self._start, timed)
        self._start = timed
        if window is None:
            return None
        for node in window.slowdown:
            self._slow_windows[node] = self._slow_windows.get(node, 0) + 1 if is_slow(window, node, self.factor) else 0
        self._last = window
        return window

    def straggler(self) -> Optional[Straggler]:
        """The slowest node that has been slow for `windows` windows in a row, if any."""
        if self._last is None:
            return None
        found: List[Tuple[float, str]] = [(self._last.slowdown[node], node) for node, count in self._slow_windows.items()
                                          if count >= self.windows and node in self._last.slowdown]
        if not found:
            return None
        slowdown, node = max(found)
        return Straggler(node, slowdown, self._slow_windows[node], self._last.slowest_rank[node])
