"""Stragglers: a node whose ranks' local compute per step stays above the other nodes'. Pure.

Collectives make every rank's step as long as the slowest rank's, so step times name no node.
What differs is the time each rank spends in work that waits for nobody: the trainer wraps it
in `TrainingControl.busy()` and its heartbeat carries the running total. Per window of
`window_steps` steps, a node's busy time per step (the mean of its ranks') is compared with
the median of the other nodes'. A node at or above `factor` times that, and at least
MIN_EXCESS_S per step above it (on a tiny step, scheduler noise alone reaches any factor),
for `windows` windows in a row is a straggler.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from slurmtools.requeue.watchdog import Beat

MIN_EXCESS_S = 0.02


@dataclass(frozen=True)
class Window:
    first_step: int
    last_step: int
    busy_per_step_s: Dict[str, float]       # node -> mean of its ranks' busy seconds per step
    slowdown: Dict[str, float]              # node -> busy per step / the other nodes' median


@dataclass(frozen=True)
class Straggler:
    node: str
    slowdown: float                         # in the window that made it one
    windows: int

    @property
    def detail(self) -> str:
        """The evidence as it goes into the drain reason and the decision."""
        return f"node={self.node} slowdown={self.slowdown:.1f}x"


def window_between(start: Dict[int, Beat], end: Dict[int, Beat]) -> Optional[Window]:
    """The window from one set of beats to a later one (by rank), or None when fewer than two
    nodes can be compared."""
    per_node: Dict[str, List[float]] = {}
    for rank, first in start.items():
        last = end.get(rank)
        if last is None or first.busy_s is None or last.busy_s is None or last.step <= first.step:
            continue
        per_node.setdefault(last.host, []).append(max(0.0, last.busy_s - first.busy_s) / (last.step - first.step))
    busy = {node: statistics.fmean(values) for node, values in sorted(per_node.items()) if node}
    if len(busy) < 2:
        return None
    slowdown = {}
    for node, value in busy.items():
        others = statistics.median(other for name, other in busy.items() if name != node)
        slowdown[node] = round(value / max(others, 1e-6), 3)
    steps = [beat.step for beat in start.values()]
    ends = [beat.step for beat in end.values()]
    return Window(min(steps), min(ends), busy, slowdown)


def excess_s(window: Window, node: str) -> float:
    """How many seconds per step node's busy time is above the other nodes' median."""
    others = [value for name, value in window.busy_per_step_s.items() if name != node]
    return window.busy_per_step_s[node] - statistics.median(others)


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
        for node, slowdown in window.slowdown.items():
            slow = slowdown >= self.factor and excess_s(window, node) >= MIN_EXCESS_S
            self._slow_windows[node] = self._slow_windows.get(node, 0) + 1 if slow else 0
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
        return Straggler(node, slowdown, self._slow_windows[node])
