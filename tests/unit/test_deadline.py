"""The job's own warning clock (Slurm's time-limit warning can be lost) and the signal flags it
raises: due inside the lead, re-read before saying so, never without a limit, never twice."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from typing import List, Optional

import pytest

from slurmtools.common.signals import SignalFlags
from slurmtools.errors import SlurmCommandError
from slurmtools.requeue import supervisor
from slurmtools.requeue.deadline import RECHECK_S, WarningClock, warning_due


class EndTimes:
    """Answers job_end_time from a list, one value per call (the last one repeats)."""

    def __init__(self, *answers: "Optional[float] | Exception") -> None:
        self.answers = list(answers)
        self.calls: List[int] = []

    def __call__(self, job_id: int) -> Optional[float]:
        self.calls.append(job_id)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.mark.parametrize("end_s, now_s, lead_s, due", [
    (1000.0, 969.0, 30, False),
    (1000.0, 970.0, 30, True),
    (1000.0, 1010.0, 30, True),
    (None, 1e12, 30, False),
    (1000.0, 999.0, 0, False),
])
def test_warning_due_is_the_time_left_inside_the_lead(end_s, now_s, lead_s, due):
    assert warning_due(end_s, now_s, lead_s) is due


def test_the_clock_reads_the_end_once_at_start_and_again_only_when_due():
    now = time.time()
    ends = EndTimes(now + 100)
    clock = WarningClock(7, 30, read_end=ends)
    assert ends.calls == [7] and clock.end_s == now + 100
    assert not clock.due(now + 60) and ends.calls == [7]
    assert clock.due(now + 75) and ends.calls == [7, 7]
    assert clock.due(now + 75 + RECHECK_S / 2) and ends.calls == [7, 7]      # no second read so soon


def test_a_raised_time_limit_postpones_the_warning():
    now = time.time()
    ends = EndTimes(now + 100, now + 400)
    clock = WarningClock(7, 30, read_end=ends)
    assert not clock.due(now + 75) and clock.end_s == now + 400
    assert not clock.due(now + 75 + RECHECK_S) and len(ends.calls) == 2      # not due by the new end: no read
    assert clock.due(now + 371)


def test_a_failed_read_keeps_the_end_it_knew_and_no_job_never_reads():
    now = time.time()
    clock = WarningClock(7, 30, read_end=EndTimes(now + 100, SlurmCommandError(["scontrol", "show", "job", "7"], None, "", timed_out=True)))
    assert clock.due(now + 80) and clock.end_s == now + 100
    ends = EndTimes(now)
    assert not WarningClock(None, 30, read_end=ends).due(now + 1e6) and ends.calls == []
    assert not WarningClock(7, 30, read_end=EndTimes(None)).due(now + 1e6)        # no time limit


def test_the_supervisor_raises_the_warning_itself_once_when_due(capsys):
    flags = SignalFlags().install({signal.SIGUSR1})
    try:
        attempt = supervisor.Attempt(job_id=7, restart=0, attempt_id="7.0", nodelist="node1")
        supervisor._warn_when_due(WarningClock(7, 30, read_end=EndTimes(time.time() + 100)), attempt, flags,
                                  signal.SIGUSR1)
        assert not flags.any() and capsys.readouterr().out == ""
        clock = WarningClock(7, 30, read_end=EndTimes(time.time() + 20))
        supervisor._warn_when_due(clock, attempt, flags, signal.SIGUSR1)
        assert flags.names() == ["SIGUSR1"]
        event = json.loads(capsys.readouterr().out)
        assert (event["slurmtools"], event["attempt_id"], event["lead_s"]) == ("warning_self_timed", "7.0", 30)
        supervisor._warn_when_due(clock, attempt, flags, signal.SIGUSR1)   # already warned: nothing more
        assert capsys.readouterr().out == ""
    finally:
        flags.restore()


def test_a_signal_landing_while_the_main_thread_holds_the_flags_lock_is_recorded():
    # the handler runs in the main thread: with a plain Lock this process would hang forever
    code = ("import os, signal\nfrom slurmtools.common.signals import SignalFlags\n"
            "flags = SignalFlags().install({signal.SIGUSR1})\n"
            "with flags._lock:\n    os.kill(os.getpid(), signal.SIGUSR1)\n    x = sum(range(1000))\n"
            "print(flags.names())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert (out.returncode, out.stdout.strip()) == (0, "['SIGUSR1']"), out.stderr
