"""Flag-only signal handlers: a handler only records the signal; the loop acts on it.

Work done inside a handler (checkpointing, collectives) deadlocks or runs late when the
signal lands while the process is blocked in a collective (FACTS-torch.md).
"""
from __future__ import annotations

import signal
import threading
from typing import Dict, Iterable, List


class SignalFlags:
    """Records which signals arrived; safe to poll from the main loop."""

    def __init__(self) -> None:
        self._seen: Dict[int, int] = {}
        self._lock = threading.Lock()
        self._previous: Dict[int, object] = {}

    def install(self, signals: Iterable[int]) -> "SignalFlags":
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def restore(self) -> None:
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)  # type: ignore[arg-type]
        self._previous.clear()

    def _handler(self, signum: int, frame: object) -> None:
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
            return sorted(signal.Signals(s).name for s in self._seen)


def signal_number(name: str) -> int:
    """'USR1' or 'SIGUSR1' -> number."""
    name = name.upper()
    return int(getattr(signal.Signals, name if name.startswith("SIG") else "SIG" + name))
