"""A supervisor event is one write of one whole line: the steps' output pumps write the ranks' lines
to the same stream from their threads, between any two writes of ours."""
from __future__ import annotations

import io
import json
import sys
from typing import List

import pytest

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
