"""Flag-only signal handlers, and warning signals held back while a process starts.

A handler only records the signal; the training loop (or the supervisor) acts on it at a
safe point. Work done inside a handler deadlocks or runs late when the signal lands while
the process is blocked in a collective: a Python handler in a rank waiting in a gloo barrier
ran only when the barrier returned, 5 s late, in our measurements.

Start-up: a warning signal (SIGUSR1/SIGUSR2) whose default action is "terminate" kills a
process that has not installed its handler yet: on a busy 2-core machine a submitit task
needs several seconds of imports first, and the time-limit warning landed there and killed
every task ("User defined signal 2"). `block_warning_signals()` as a process's first statement
holds such a signal pending (the mask survives exec); `SignalFlags.install()` unblocks it
after the handler exists, so a signal that came early is handled, not fatal.
"""
from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Dict, Iterable, List, Optional

WARNING_SIGNALS = frozenset({signal.SIGUSR1, signal.SIGUSR2})
WARNING_SIGNAL_NAMES = frozenset(signal.Signals(number).name for number in WARNING_SIGNALS)


def block_warning_signals() -> None:
    """Hold SIGUSR1/SIGUSR2 pending in this thread (and the threads and programs it starts)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, WARNING_SIGNALS)


def unblock_warning_signals() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, WARNING_SIGNALS)


class SignalFlags:
    """Records which signals arrived; safe to poll from the main loop."""

    def __init__(self) -> None:
        self._seen: Dict[int, int] = {}
        # re-entrant: the handler runs in the main thread, possibly while that thread holds the
        # lock in any()/seen()/names(); a plain Lock would deadlock the process on that signal
        self._lock = threading.RLock()
        self._previous: Dict[int, object] = {}

    def install(self, signals: Iterable[int]) -> "SignalFlags":
        """Install the flag handlers, then unblock those signals: one held pending since
        start-up (block_warning_signals) is delivered now, to this handler."""
        wanted = set(signals)
        for sig in wanted:
            self._previous[sig] = signal.signal(sig, self._handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, wanted)
        return self

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        self._previous.clear()

    def _handler(self, signum: int, frame: Optional[FrameType]) -> None:
        with self._lock:
            self._seen[signum] = self._seen.get(signum, 0) + 1

    def seen(self, sig: int) -> bool:
        with self._lock:
            return self._seen.get(sig, 0) > 0

    def any(self) -> bool:
        with self._lock:
            return bool(self._seen)

    def names(self) -> List[str]:
        with self._lock:
            return sorted(signal.Signals(sig).name for sig in list(self._seen))


def signal_number(name: str) -> int:
    """'USR1' or 'SIGUSR1' -> number."""
    name = name.upper()
    return int(getattr(signal.Signals, name if name.startswith("SIG") else "SIG" + name))
