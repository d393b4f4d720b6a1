"""The supervisor never waits for flight-recorder dumps: a hang no single rank explains asks for
them once and is settled on a later pass (every dump there, or the wait over: flightrec.dump_wait_over), so a
warning or a dead node seen meanwhile is handled on the very next pass."""
from __future__ import annotations

import pickle
from pathlib import Path

from slurmtools.common.control_dir import FLIGHT_RECORDER_REQUEST_FILE
from slurmtools.requeue import flightrec, nodecheck, observe, watchdog
from tests.unit.test_flight_recorder import dump, entry

BEATS = [watchdog.Beat(rank, "node1" if rank < 2 else "node2", 5, 100.0) for rank in range(4)]
STALL = watchdog.Stall(30.0, None, None, 5)


def _request(tmp_path: Path) -> observe.DumpRequest:
    (tmp_path / "rec").mkdir()
    return observe.DumpRequest(tmp_path, "7.0", tmp_path / "rec")


def _write_dumps(recorder: Path, ranks) -> None:
    waiting = dump(entry(41), entry(42, state="started"))
    behind = dump(entry(41))
    for rank in ranks:
        (recorder / f"rank_{rank}").write_bytes(pickle.dumps(behind if rank == 3 else waiting))


def test_the_first_pass_asks_for_the_dumps_and_does_not_wait(tmp_path, capsys):
    request = _request(tmp_path)
    assert request.settle(STALL, BEATS, 1000.0) is None
    assert (tmp_path / FLIGHT_RECORDER_REQUEST_FILE).exists()
    assert request.settle(STALL, BEATS, 1000.5) is None            # 1 of 4 dumps: not yet
    assert capsys.readouterr().out == ""


def test_the_pass_that_finds_every_dump_names_the_laggard(tmp_path):
    request = _request(tmp_path)
    assert request.settle(STALL, BEATS, 1000.0) is None
    _write_dumps(tmp_path / "rec", range(4))
    found = request.settle(STALL, BEATS, 1000.5)
    assert found is not None and (found.rank, found.host) == (3, "node2")


def test_missing_dumps_settle_unattributed_after_the_wait(tmp_path, capsys):
    request = _request(tmp_path)
    assert request.settle(STALL, BEATS, 1000.0) is None
    _write_dumps(tmp_path / "rec", range(3))                      # rank 3 never dumps
    assert request.settle(STALL, BEATS, 1001.0) is None             # 3 arrived: quiet from here
    assert request.settle(STALL, BEATS, 1001.0 + flightrec.DUMP_WAIT_S - 0.1) is None
    found = request.settle(STALL, BEATS, 1001.0 + flightrec.DUMP_WAIT_S)
    assert found is not None and found.rank is None
    assert '"dumps": 3, "laggard": null, "ranks": 4' in capsys.readouterr().out


def test_records_still_arriving_extend_the_wait_up_to_its_maximum(tmp_path):
    """At 64,000 ranks the records come over several passes: each arrival restarts the quiet
    time, and DUMP_WAIT_MAX_S after the request the stall is settled on those there."""
    beats = [watchdog.Beat(rank, f"node{rank // 2}", 5, 100.0) for rank in range(40)]
    request = _request(tmp_path)
    assert request.settle(STALL, beats, 1000.0) is None
    waiting = pickle.dumps(dump(entry(41), entry(42, state="started")))
    now = 1000.0
    for rank in range(39):                      # one more every 4 s: never quiet for DUMP_WAIT_S
        now += flightrec.DUMP_WAIT_S - 1
        if now - 1000.0 >= flightrec.DUMP_WAIT_MAX_S:
            break
        (tmp_path / "rec" / f"rank_{rank}").write_bytes(waiting)
        assert request.settle(STALL, beats, now) is None, now
    assert request.there == rank
    found = request.settle(STALL, beats, 1000.0 + flightrec.DUMP_WAIT_MAX_S)
    assert found is not None and found.rank is None


def test_the_wait_is_over_when_quiet_or_at_its_maximum():
    assert not flightrec.dump_wait_over(1000.0, None, 1000.0 + flightrec.DUMP_WAIT_S - 0.01)
    assert flightrec.dump_wait_over(1000.0, None, 1000.0 + flightrec.DUMP_WAIT_S)
    assert not flightrec.dump_wait_over(1000.0, 1030.0, 1030.0 + flightrec.DUMP_WAIT_S - 0.01)
    assert flightrec.dump_wait_over(1000.0, 1030.0, 1030.0 + flightrec.DUMP_WAIT_S)
    assert flightrec.dump_wait_over(1000.0, 1059.0, 1000.0 + flightrec.DUMP_WAIT_MAX_S)


def test_a_stall_with_its_rank_acts_at_once_and_an_ended_stall_resets(tmp_path):
    request = _request(tmp_path)
    named = watchdog.Stall(30.0, 3, "node2", 4)
    assert request.settle(named, BEATS, 1000.0) == named
    assert not (tmp_path / FLIGHT_RECORDER_REQUEST_FILE).exists()
    assert request.settle(STALL, BEATS, 1000.0) is None
    assert request.settle(None, BEATS, 1001.0) is None and request.asked_at is None
    assert request.settle(STALL, BEATS, 1000.0 + 60) is None       # a new stall asks again


def test_without_a_recorder_dir_the_stall_acts_at_once(tmp_path):
    assert observe.DumpRequest(tmp_path, "7.0", None).settle(STALL, BEATS, 1000.0) == STALL


def test_with_a_node_watch_a_node_cut_off_is_named_when_the_dumps_name_nobody(tmp_path, monkeypatch):
    """Every rank waits in the same collective (the dumps agree), node3's slurmd does not
    answer: probed in the node watch's threads while the loop goes on, then named."""
    watch = nodecheck.NodeWatch(30, ["node1", "node2", "node3"], "node1", 0.0)
    monkeypatch.setattr(watch, "answers", lambda node: node != "node3")
    beats = [watchdog.Beat(rank, f"node{rank + 1}", 5, 100.0) for rank in range(3)]
    (tmp_path / "rec").mkdir()
    request = observe.DumpRequest(tmp_path, "7.0", tmp_path / "rec", watch)
    try:
        assert request.settle(STALL, beats, 1000.0) is None
        waiting = pickle.dumps(dump(entry(41), entry(42, state="started")))
        for rank in range(3):
            (tmp_path / "rec" / f"rank_{rank}").write_bytes(waiting)
        assert request.reach is not None and request.reach.result(timeout=10) == ["node3"]
        found = request.settle(STALL, beats, 1000.5)
        assert found is not None and (found.rank, found.host) == (2, "node3")
        assert "the slurmd of node3 does not answer: cut off from the other nodes" in found.detail
    finally:
        watch.close()
