"""A supervisor event, and each of its lines for a person on stderr, is one write of one whole
line: the steps' output pumps write the ranks' lines to the same streams from their threads,
between any two writes of ours."""
from __future__ import annotations

import io
import json
import sys
from typing import Dict, List

import pytest

from slurmtools.common.one_write import say
from slurmtools.common.signals import SignalFlags
from slurmtools.errors import SlurmCommandError
from slurmtools.requeue import actions
from slurmtools.requeue.actions import emit


class _Writes(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.calls: List[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


def test_an_event_is_one_write_of_one_whole_line(monkeypatch: pytest.MonkeyPatch) -> None:
    out = _Writes()
    monkeypatch.setattr(sys, "stdout", out)
    emit("decision", "7.0", cause="completed", action="complete")
    assert len(out.calls) == 1
    line = out.calls[0]
    assert line.endswith("\n") and line.count("\n") == 1
    record = json.loads(line)
    assert {k: v for k, v in record.items() if k != "t"} == {
        "slurmtools": "decision", "attempt_id": "7.0", "cause": "completed", "action": "complete"}


def test_a_message_for_a_person_is_one_write_of_one_whole_line_on_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    err = _Writes()
    monkeypatch.setattr(sys, "stderr", err)
    say("slurmtools: STOP after attempt 7.0: too many failures")
    assert err.calls == ["slurmtools: STOP after attempt 7.0: too many failures\n"]


def test_a_failed_requeue_is_said_on_stderr_in_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor's own words on stderr go through say (not print), so they stay whole lines."""
    def refused(job_id: int, fields: Dict[str, str]) -> None:
        raise SlurmCommandError(["scontrol", "requeue"], 1, "refused")

    out, err = _Writes(), _Writes()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(actions.slurm, "requeue_excluding", refused)
    assert actions.regrow(7, "7.0", 4, SignalFlags()) == 1
    assert len(out.calls) == 1 and len(err.calls) == 1
    assert err.calls[0].startswith("slurmtools: requeue of job 7 for its 4 nodes failed: ")
    assert err.calls[0].endswith("\n") and err.calls[0].count("\n") == 1
