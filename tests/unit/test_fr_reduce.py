"""Flight-recorder dumps reduced where they are made: a rank's record keeps each process group's
newest collective (what attribution reads), the supervisor reads records before full dumps, full
dumps one at a time and within a time budget, and malformed records are no evidence."""
from __future__ import annotations

import json
import pickle

import pytest

from slurmtools.requeue import flightrec
from slurmtools.train import fr_dump, node_beat
from tests.unit.test_flight_recorder import dump, entry

WAITING = dump(entry(41), entry(42, "gloo:all_reduce", state="started"), entry(7, pg=1), entry(99, "x", p2p=True))
BEHIND = dump(entry(41), entry(7, pg=1))


def _record(rank, one):
    return fr_dump.summary_record(rank, fr_dump.reduce(one))


def test_a_record_keeps_each_groups_newest_collective_and_reads_back_exactly():
    record = _record(5, WAITING)
    assert record == {"rank": 5, "groups": {"0": [42, "gloo:all_reduce", "started"], "1": [7, "nccl:all_reduce",
                                                                                          "completed"]}}
    assert fr_dump.parse_summary(json.loads(json.dumps(record))) == (5, {"0": (42, "gloo:all_reduce", "started"),
                                                                         "1": (7, "nccl:all_reduce", "completed")})


@pytest.mark.parametrize("bad", [
    None, [], {"groups": {}}, {"rank": True, "groups": {}}, {"rank": -1, "groups": {}}, {"rank": 2 ** 70, "groups": {}},
    {"rank": 1, "groups": []}, {"rank": 1, "groups": {"0": [1, "a"]}}, {"rank": 1, "groups": {"0": [1.5, "a", "b"]}},
    {"rank": 1, "groups": {"0": [1, "a", 3]}}, {"rank": 1, "groups": {"0": [1, "a" * 201, "b"]}},
    {"rank": 1, "groups": {str(n): [1, "a", "b"] for n in range(fr_dump.MAX_GROUPS + 1)}},
])
def test_a_malformed_record_is_no_evidence(bad):
    assert fr_dump.parse_summary(bad) is None


def test_a_reduced_record_is_bounded_whatever_the_dump():
    many = dump(*[entry(1, pg=n) for n in range(fr_dump.MAX_GROUPS + 50)], entry(3, "n" * 5000, pg=0))
    reduced = fr_dump.reduce(many)
    assert len(reduced) == fr_dump.MAX_GROUPS and len(reduced["0"][1]) == fr_dump.MAX_NAME_CHARS
    assert len(json.dumps(fr_dump.summary_record(0, reduced))) < fr_dump.MAX_SUMMARY_BYTES
    assert fr_dump.reduce({"entries": "no list"}) == {} and fr_dump.reduce({}) == {}


def test_records_per_rank_and_per_node_are_read_and_win_over_a_full_dump(tmp_path):
    (tmp_path / "rank_0.json").write_text(json.dumps(_record(0, WAITING)))
    node = {"node": "node2", "ranks": [_record(2, BEHIND), _record(3, WAITING), {"rank": "x"}]}
    (tmp_path / node_beat.node_file_name("node2")).write_text(json.dumps(node))
    (tmp_path / "rank_3").write_bytes(pickle.dumps(BEHIND))      # rank 3's record says otherwise: the record wins
    (tmp_path / "rank_1").write_bytes(pickle.dumps(WAITING))     # rank 1 has only its full dump
    (tmp_path / "rank_4.json").write_text("{torn")
    reduced = flightrec.read_reduced(tmp_path)
    assert sorted(reduced) == [0, 1, 2, 3] and reduced[3] == fr_dump.reduce(WAITING)
    assert flightrec.ranks_there(tmp_path) == {0, 1, 2, 3}
    assert flightrec.dumps_ready(tmp_path, 4) and not flightrec.dumps_ready(tmp_path, 5)
    found = flightrec.laggard(reduced, {0: "node1", 1: "node1", 2: "node2", 3: "node2"})
    assert (found.rank, found.host, found.seq, found.collective) == (2, "node2", 42, "gloo:all_reduce")


def test_full_dumps_past_the_budget_are_not_read_and_the_records_still_are(tmp_path):
    (tmp_path / "rank_0.json").write_text(json.dumps(_record(0, WAITING)))
    (tmp_path / "rank_1").write_bytes(pickle.dumps(BEHIND))
    assert sorted(flightrec.read_reduced(tmp_path, budget_s=-1.0)) == [0]
    assert sorted(flightrec.read_reduced(tmp_path)) == [0, 1]


def test_local_rank_0_gathers_its_nodes_records_into_one_file_and_rewrites_it_only_when_more_come(tmp_path):
    control, recorder = tmp_path / "control", tmp_path / "control" / "rec"
    recorder.mkdir(parents=True)
    memory = tmp_path / "shm" / "node1"
    memory.mkdir(parents=True)
    leader = node_beat.NodeBeats(control, memory, 0, "node1", True, ())
    other = node_beat.NodeBeats(control, memory, 1, "node1", False, ())
    heartbeats = control / "heartbeat"
    heartbeats.mkdir()
    leader.write({"rank": 0}, heartbeats, 1.0)
    assert list(recorder.iterdir()) == []                         # nobody asked: no file
    other.write_flight_record(_record(1, BEHIND), recorder)
    leader.write({"rank": 0}, heartbeats, 2.0)                    # not yet told where: its own record tells it
    leader.write_flight_record(_record(0, WAITING), recorder)
    leader.write({"rank": 0}, heartbeats, 3.0)
    node_file = recorder / node_beat.node_file_name("node1")
    assert sorted(flightrec.read_reduced(recorder)) == [0, 1]
    node_file.write_text(json.dumps({"node": "node1", "ranks": []}))
    leader.write({"rank": 0}, heartbeats, 4.0)                    # nothing new: not rewritten
    assert json.loads(node_file.read_text())["ranks"] == []
    node_beat.clear(memory)
    assert list((memory / node_beat.FLIGHT_RECORDS_SUBDIR).iterdir()) == []
