"""Heartbeats gathered per node: the ranks write into node memory, local rank 0 writes one file per
node into the control dir and mirrors the supervisor's markers back; the watchdog reads both forms."""
from __future__ import annotations

import json
import os
import socket

import pytest

from slurmtools.common.control_dir import FLIGHT_RECORDER_REQUEST_FILE, HEARTBEAT_DIR, REQUEST_FILE
from slurmtools.requeue import watchdog
from slurmtools.train import node_beat, node_sweep
from slurmtools.train.control import TrainingControl

HOST = socket.gethostname()


@pytest.fixture
def node_memory(tmp_path, monkeypatch):
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setenv(node_beat.NODE_LOCAL_DIR_ENV, str(shm))
    monkeypatch.setenv("SLURMTOOLS_ATTEMPT_ID", "7.0")
    return shm


def _control(control, rank, local, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", str(local))
    return TrainingControl(control_dir=control, rank=rank, heartbeat_interval_s=3600)


def test_a_nodes_ranks_reach_the_control_dir_as_one_file_written_by_local_rank_0(tmp_path, node_memory, monkeypatch):
    control = tmp_path / "control"
    leader = _control(control, 8, 0, monkeypatch)
    other = _control(control, 9, 1, monkeypatch)
    other.heartbeat(5)
    assert list((control / HEARTBEAT_DIR).iterdir()) == []          # nothing on the shared file system yet
    leader.heartbeat(6)
    assert [p.name for p in (control / HEARTBEAT_DIR).iterdir()] == [node_beat.node_file_name(HOST)]
    beats, invalid = watchdog.scan_heartbeats(control)
    assert [(b.rank, b.host, b.step, b.attempt_id) for b in beats] == [(8, HOST, 6, "7.0"), (9, HOST, 5, "7.0")]
    assert invalid == 0
    other.heartbeat(7)                                                # reaches the file with the leader's next beat
    assert [b.step for b in watchdog.read_heartbeats(control)] == [6, 5]
    leader.heartbeat(8)
    assert [b.step for b in watchdog.read_heartbeats(control)] == [8, 7]


def test_the_supervisors_markers_reach_the_ranks_through_node_memory(tmp_path, node_memory, monkeypatch):
    control = tmp_path / "control"
    leader = _control(control, 0, 0, monkeypatch)
    other = _control(control, 1, 1, monkeypatch)
    leader.heartbeat(1)
    (control / REQUEST_FILE).touch()
    (control / FLIGHT_RECORDER_REQUEST_FILE).touch()
    assert not other.checkpoint_requested()                          # not mirrored yet
    leader.heartbeat(2)
    assert other.checkpoint_requested() and leader.checkpoint_requested()
    assert other._marker(FLIGHT_RECORDER_REQUEST_FILE)
    (control / REQUEST_FILE).unlink()
    leader.heartbeat(3)
    assert not other.checkpoint_requested()


def test_records_of_an_earlier_launch_are_cleared_by_local_rank_0(tmp_path, node_memory, monkeypatch):
    control = tmp_path / "control"
    directory = node_beat.node_dir(node_memory, control, "7.0", HOST)
    (directory / "13.json").write_text(json.dumps({"rank": 13, "step": 1, "time": 1.0, "host": HOST}))
    leader = _control(control, 0, 0, monkeypatch)
    leader.heartbeat(1)
    assert [b.rank for b in watchdog.read_heartbeats(control)] == [0]


def test_two_jobs_of_one_user_never_share_a_node_directory(tmp_path):
    first = node_beat.node_dir(tmp_path, tmp_path / "a", "7.0", "node1")
    second = node_beat.node_dir(tmp_path, tmp_path / "b", "7.0", "node1")
    assert first is not None and second is not None and first != second and first.parent.parent == second.parent.parent


def test_without_a_private_node_directory_or_a_local_rank_each_rank_writes_its_own_file(tmp_path, node_memory,
                                                                                        monkeypatch, capsys):
    control = tmp_path / "control"
    base = node_memory / f"slurmtools-{os.geteuid()}"
    base.mkdir()
    base.chmod(0o777)                                                 # others could plant records: not ours alone
    _control(control, 4, 0, monkeypatch).heartbeat(1)
    assert [p.name for p in (control / HEARTBEAT_DIR).iterdir()] == ["4.json"]
    assert capsys.readouterr().err == (f"slurmtools: SLURMTOOLS_NODE_LOCAL_DIR {node_memory}: no directory of this "
                                       "user's own there (missing, or others can write it); each rank writes its "
                                       "heartbeat to the control dir\n")      # local rank 0 says so, once per node
    _control(control, 6, 1, monkeypatch)
    assert capsys.readouterr().err == ""
    base.chmod(0o700)
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.delenv("SLURM_LOCALID", raising=False)
    TrainingControl(control_dir=control, rank=5).heartbeat(1)
    assert sorted(p.name for p in (control / HEARTBEAT_DIR).iterdir()) == ["4.json", "5.json"]
    assert node_beat.local_rank({"SLURM_LOCALID": "3"}) == 3 and node_beat.local_rank({"LOCAL_RANK": "x"}) is None


@pytest.mark.parametrize("content", ['{"node": "n", "ranks": {"rank": 0}}', '[1, 2]', "{", '{"ranks": [1, {"rank": -1}]}'])
def test_a_malformed_node_file_is_no_evidence(tmp_path, content):
    (tmp_path / HEARTBEAT_DIR).mkdir()
    (tmp_path / HEARTBEAT_DIR / "node-n.json").write_text(content)
    beats, invalid = watchdog.scan_heartbeats(tmp_path, 1_000_000.0)
    assert beats == [] and invalid >= 1


def test_local_rank_0_removes_this_users_launch_directories_nobody_wrote_for_ten_minutes(tmp_path, node_memory,
                                                                                          monkeypatch):
    # job 5 is gone from Slurm (node_sweep: age alone never removes a Slurm job's directory)
    monkeypatch.setattr(node_sweep, "this_users_live_jobs", lambda: frozenset({6, 7}))
    old = node_beat.node_dir(node_memory, tmp_path / "ended", "5.0", "node1")
    fresh = node_beat.node_dir(node_memory, tmp_path / "running", "6.0", "node2")
    (old / "0.json").write_text("{}")
    (fresh / "0.json").write_text("{}")
    long_ago = os.stat(old).st_mtime - node_beat.STALE_AFTER_S - 60
    for path in (old / "0.json", old, old.parent):
        os.utime(path, (long_ago, long_ago))
    _control(tmp_path / "control", 0, 0, monkeypatch)
    assert not old.parent.exists() and (fresh / "0.json").exists()


def test_the_supervisor_sleeps_longer_after_a_long_pass_to_stay_within_a_tenth_of_a_core():
    from slurmtools.requeue.observe import MAX_SUPERVISOR_CPU_SHARE, pace_s
    assert pace_s(0.5, 0.01) == 0.5
    assert pace_s(0.5, 0.2) == pytest.approx(1.8)
    assert 0.2 / (0.2 + pace_s(0.5, 0.2)) == pytest.approx(MAX_SUPERVISOR_CPU_SHARE)
