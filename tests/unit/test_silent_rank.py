"""A rank whose process stopped (SIGSTOP, or stuck holding the GIL) writes neither steps nor its
keep-alive nor a flight record: the others wait for it in a collective with their keep-alives
going on. The stall is then named by the silence of that node's ranks (watchdog.silent_rank),
after the flight recorders had their chance (observe.DumpRequest)."""
from __future__ import annotations

import pickle
from pathlib import Path

from slurmtools.requeue import flightrec, observe, watchdog
from tests.unit.test_flight_recorder import dump, entry

NOW = 1000.0


def _beats(silent_since: dict) -> list:
    """8 ranks on 4 nodes at step 5 (done at NOW - 30), every keep-alive fresh but the silent ones'."""
    return [watchdog.Beat(rank, f"node{rank // 2 + 1}", 5, NOW - 30, alive_s=silent_since.get(rank, NOW - 0.5))
            for rank in range(8)]


STALL = watchdog.Stall(30.0, None, None, 5)


def test_one_silent_rank_is_named_with_its_node():
    found = watchdog.silent_rank(STALL, _beats({5: NOW - 29}), NOW)
    assert (found.rank, found.host) == (5, "node3")
    assert found.detail == "rank 5 on node3 showed no life for 29 s while the others waited at step 5"


def test_a_node_whose_ranks_are_all_silent_is_named_by_its_first():
    found = watchdog.silent_rank(STALL, _beats({6: NOW - 28, 7: NOW - 29}), NOW)
    assert (found.rank, found.host) == (6, "node4")
    assert found.detail.startswith("ranks 6,7 on node4 showed no life for 28 s")


def test_silence_shorter_than_half_the_stall_or_the_floor_names_nobody():
    assert watchdog.silent_rank(STALL, _beats({5: NOW - 14}), NOW) == STALL          # < 30 / 2
    short = watchdog.Stall(8.0, None, None, 5)
    assert watchdog.silent_rank(short, _beats({5: NOW - watchdog.SILENT_RANK_MIN_S + 0.1}), NOW) == short
    assert watchdog.silent_rank(short, _beats({5: NOW - watchdog.SILENT_RANK_MIN_S}), NOW).rank == 5


def test_silent_ranks_on_two_nodes_or_a_majority_name_nobody():
    assert watchdog.silent_rank(STALL, _beats({1: NOW - 29, 5: NOW - 29}), NOW) == STALL
    every = {rank: NOW - 29 for rank in range(4)}
    assert watchdog.silent_rank(STALL, _beats(every), NOW) == STALL                  # half: not a minority
    old_style = [watchdog.Beat(rank, f"node{rank // 2 + 1}", 5, NOW - 30) for rank in range(8)]
    assert watchdog.silent_rank(STALL, old_style, NOW) == STALL                      # no keep-alive times


def test_a_stall_already_named_is_kept():
    named = watchdog.Stall(30.0, 2, "node2", 4, "behind")
    assert watchdog.silent_rank(named, _beats({5: NOW - 29}), NOW) == named


def test_the_dump_request_names_the_silent_rank_when_its_record_never_comes(tmp_path, capsys):
    """Seven ranks write their records (all waiting in collective #42); rank 5 writes none: the
    records name nobody, the wait ends quiet, and rank 5's silence names node3."""
    (tmp_path / "rec").mkdir()
    request = observe.DumpRequest(tmp_path, "7.0", tmp_path / "rec")
    beats = _beats({5: NOW - 29})
    assert request.settle(STALL, beats, NOW) is None
    waiting = pickle.dumps(dump(entry(41), entry(42, state="started")))
    for rank in (0, 1, 2, 3, 4, 6, 7):
        (tmp_path / "rec" / f"rank_{rank}").write_bytes(waiting)
    assert request.settle(STALL, beats, NOW + 1) is None
    later = NOW + 1 + flightrec.DUMP_WAIT_S
    found = request.settle(STALL, _beats({5: NOW - 29}), later)
    assert found is not None and (found.rank, found.host) == (5, "node3")
    assert "showed no life for 35 s" in found.detail
    assert '"dumps": 7, "laggard": null, "ranks": 8' in capsys.readouterr().out
