"""The ledger is read incrementally: a supervisor that reads its job's ledger at every attempt
start parses only the lines appended since, and gets exactly what a whole read gives, also
after a torn last line, a replaced file or a shorter one."""
from __future__ import annotations

import json

from slurmtools.common import ledger


def _start(n: int) -> ledger.AttemptStart:
    return ledger.AttemptStart(f"7.{n}", 1000.0 + n, restart=n)


def _fresh(path):
    """What a process that never read this ledger gets."""
    ledger._READ.clear()
    return ledger.read(path)


def test_only_appended_lines_are_parsed_and_the_events_are_those_of_a_whole_read(tmp_path, monkeypatch):
    for n in range(3):
        ledger.append(tmp_path, _start(n))
    assert ledger.read(tmp_path) == [_start(0), _start(1), _start(2)]
    parsed = []
    real = ledger.parse
    monkeypatch.setattr(ledger, "parse", lambda record: parsed.append(record) or real(record))
    ledger.append(tmp_path, _start(3))
    assert ledger.read(tmp_path) == [_start(n) for n in range(4)]
    assert [record["attempt_id"] for record in parsed] == ["7.3"]
    assert ledger.read(tmp_path) == _fresh(tmp_path)


def test_a_torn_last_line_is_read_again_when_it_is_whole(tmp_path):
    ledger.append(tmp_path, _start(0))
    line = json.dumps({"event": "start", "attempt_id": "7.1", "time_s": 1001.0, "restart": 1})
    with (tmp_path / ledger.LEDGER_FILE).open("a") as out:
        out.write(line[:20])
    assert ledger.read(tmp_path) == [_start(0)]
    with (tmp_path / ledger.LEDGER_FILE).open("a") as out:
        out.write(line[20:] + "\n")
    assert ledger.read(tmp_path) == [_start(0), _start(1)] == _fresh(tmp_path)


def test_a_replaced_or_shorter_ledger_is_read_whole_again(tmp_path):
    for n in range(3):
        ledger.append(tmp_path, _start(n))
    assert len(ledger.read(tmp_path)) == 3
    path = tmp_path / ledger.LEDGER_FILE
    replacement = tmp_path / "new.jsonl"
    replacement.write_text(path.read_text().splitlines(keepends=True)[2])
    replacement.replace(path)
    assert ledger.read(tmp_path) == [_start(2)]
    ledger.append(tmp_path, _start(3))
    assert len(ledger.read(tmp_path)) == 2
    path.write_text("")                                  # same file, cut short
    ledger.append(tmp_path, _start(4))
    assert ledger.read(tmp_path) == [_start(4)] == _fresh(tmp_path)
    ledger.append(tmp_path, _start(5))
    assert len(ledger.read(tmp_path)) == 2
    rewritten = "".join(json.dumps({"event": "start", "attempt_id": f"8.{n}", "time_s": 2000.0 + n}) + "\n"
                        for n in range(4))
    path.write_text(rewritten)          # same inode, longer than what was read: not mistaken for an append
    assert [event.attempt_id for event in ledger.read(tmp_path)] == ["8.0", "8.1", "8.2", "8.3"]
