"""The step log gathered per node (node_steps.py): one line per node and step in the control dir,
with the node's slowest rank, the tokens of all its ranks and its lowest rank's loss; what the
report computes from it is what it computes from per-rank files."""
from __future__ import annotations

import json
import socket

from slurmtools.report import text as jobreport
from slurmtools.train import steplog
from slurmtools.train.node_steps import aggregate
from slurmtools.train.steplog import StepLog
from tests.unit.test_jobreport import Clock


def _rank_record(rank: int, step: int, step_s: float, **extra) -> dict:
    return {"kind": "step", "attempt_id": "9.0", "rank": rank, "host": "node1", "step": step,
            "time_s": 1000.0 + step + rank / 100, "step_s": step_s, **extra}


def test_eight_ranks_of_a_step_make_one_node_record():
    records = [_rank_record(rank, 3, 1.0 if rank == 14 else 0.5, tokens=100, loss=2.0 + rank, collective_s=rank / 10)
               for rank in range(8, 16)]
    records[0]["data_wait_s"] = 0.02
    assert aggregate(records, "node2") == [{
        "kind": "node_step", "attempt_id": "9.0", "host": "node2", "step": 3, "rank": 8, "slowest_rank": 14,
        "ranks": 8, "step_s": 1.0, "time_s": 1003.15, "collective_s": 1.5, "data_wait_s": 0.02, "tokens": 800,
        "loss": 10.0}]


def test_records_of_several_steps_and_attempts_in_step_order_foreign_lines_left_out():
    records = [_rank_record(1, 5, 0.5), _rank_record(0, 4, 0.5), {"kind": "checkpoint", "step": 4},
               dict(_rank_record(0, 4, 0.5), attempt_id="9.1"), {"kind": "step", "rank": "x", "step": 4}]
    assert [(n["attempt_id"], n["step"], n["ranks"]) for n in aggregate(records, "node1")] == [
        ("9.0", 4, 1), ("9.0", 5, 1), ("9.1", 4, 1)]


def _logs(tmp_path, clock, ranks=range(3)):
    node = tmp_path / "shm" / "node1"
    node.mkdir(parents=True)
    return [StepLog(tmp_path / "control", "9.0", rank, "node1", flush_interval_s=5, clock=clock, node_dir=node,
                    gathers=rank == 0) for rank in ranks]


def test_local_rank_0_takes_the_nodes_lines_and_a_late_rank_takes_its_own_at_its_last_flush(tmp_path):
    clock = Clock()
    logs = _logs(tmp_path, clock)
    for step in (1, 2):
        for log in logs:
            log.step(step, 0.5 + log.rank / 10, tokens=10, loss=float(log.rank))
    logs[1].flush()
    logs[2].flush()                            # into node memory: nothing in the control dir yet
    assert not (tmp_path / "control" / "steps").exists()
    logs[0].flush()                            # local rank 0 takes the node's lines
    assert sorted(p.name for p in (tmp_path / "control" / "steps").iterdir()) == ["9.0.node-node1.by0.jsonl"]
    logs[2].step(3, 0.9, tokens=10, loss=2.0)
    logs[0].step(3, 0.5, tokens=10, loss=0.0)
    logs[0].flush(last=True)                   # rank 0 ends first: rank 2's step 3 is not there yet
    logs[1].step(3, 0.6, tokens=10, loss=1.0)
    logs[1].flush(last=True)
    logs[2].flush(last=True)                   # the last ones take their own
    assert list((tmp_path / "shm" / "node1" / "steps").iterdir()) == []
    history = steplog.read(tmp_path / "control")
    assert [(s.step, s.rank, s.ranks, s.slowest_rank, s.step_s, s.tokens, s.loss) for s in history.steps] == [
        (1, 0, 3, 2, 0.7, 30, 0.0), (2, 0, 3, 2, 0.7, 30, 0.0), (3, 0, 3, 2, 0.9, 30, 0.0)]
    lines = [json.loads(line) for path in sorted((tmp_path / "control" / "steps").iterdir())
             for line in path.read_text().splitlines()]
    assert len(lines) == 5                     # steps 1, 2 once; step 3 in three parts, merged on reading


def test_the_report_reads_a_gathered_log_as_it_reads_per_rank_files(tmp_path):
    """Per node step time, the job's step time, rank 0's loss; tokens/s: the node's tokens over its
    slowest rank's time (a synchronous step ends with its slowest rank)."""
    clock = Clock()
    gathered = _logs(tmp_path / "g", clock)
    (tmp_path / "r").mkdir()
    per_rank = [StepLog(tmp_path / "r" / "control", "9.0", rank, "node1", flush_interval_s=5, clock=clock)
                for rank in range(3)]
    for step in range(1, 6):
        for index in range(3):
            for log in (gathered[index], per_rank[index]):
                log.step(step, 0.5 + index / 10 + (0.4 if step == 3 else 0.0), tokens=10, loss=5.0 / step)
    for log in [*gathered[1:], gathered[0], *per_rank]:
        log.flush(last=True)
    one, other = (jobreport.build("9", [], steplog.read(tmp_path / name / "control")) for name in ("g", "r"))
    assert one.step_s_by_node == other.step_s_by_node == {"node1": [(1, 0.7), (2, 0.7), (3, 1.1), (4, 0.7), (5, 0.7)]}
    assert one.loss == other.loss == {"9.0": [(step, 5.0 / step) for step in range(1, 6)]}
    assert one.slowest_rank_by_node == other.slowest_rank_by_node == {"node1": 2}
    assert "median step time by node: node1 0.700 s (slowest rank 2)" in jobreport.format_text(one)
    assert jobreport.job_step_time_s(steplog.read(tmp_path / "g" / "control")) == 0.7
    assert [round(rate, 3) for _, rate in one.tokens_per_s["9.0"]] == [42.857, 42.857, 27.273, 42.857, 42.857]


def test_a_file_taken_by_one_rank_is_not_taken_again(tmp_path):
    clock = Clock()
    logs = _logs(tmp_path, clock, ranks=(0, 1))
    logs[1].step(1, 0.5)
    logs[1].flush()
    assert logs[0].node.take() == 1 and logs[1].node.take() == 0
    assert len(steplog.read(tmp_path / "control").steps) == 1


def test_a_malformed_node_record_is_skipped(tmp_path):
    steps = tmp_path / "steps"
    steps.mkdir()
    good = {"kind": "node_step", "attempt_id": "9.0", "host": "node1", "step": 1, "rank": 0, "slowest_rank": 1,
            "ranks": 2, "time_s": 1000.0, "step_s": 0.5}
    bad = [dict(good, ranks=0), dict(good, slowest_rank="x"), dict(good, step_s=-1), {"kind": "node_step"}]
    (steps / "9.0.node-node1.by0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*bad, good]))
    assert [(s.step, s.ranks) for s in steplog.read(tmp_path).steps] == [(1, 2)]


def test_training_control_gathers_its_step_log_per_node(tmp_path, monkeypatch):
    """Two ranks of one node through TrainingControl (LOCAL_RANK, node memory in tmp): one node
    file in the control dir's steps/, none per rank; the report reads both ranks' steps in it."""
    from slurmtools.train import node_beat
    from slurmtools.train.control import TrainingControl
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setenv(node_beat.NODE_LOCAL_DIR_ENV, str(shm))
    monkeypatch.setenv("SLURMTOOLS_ATTEMPT_ID", "7.0")
    monkeypatch.delenv("SLURMTOOLS_METRICS_DIR", raising=False)
    controls = []
    for rank in (0, 1):
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        controls.append(TrainingControl(control_dir=tmp_path / "control", rank=rank, heartbeat_interval_s=3600))
    for step in (1, 2):
        for control in controls:
            control.step_done(step, 0.5 + control.rank, tokens=4, loss=float(control.rank))
    controls[1].flush_metrics()               # rank 1's lines into node memory
    for control in controls:
        control.mark_complete(2)              # local rank 0 takes them; rank 1 finds none left
    files = sorted(p.name for p in (tmp_path / "control" / "steps").iterdir())
    assert files == [f"7.0.{node_beat.node_file_name(socket.gethostname())[:-5]}.by0.jsonl"]
    history = steplog.read(tmp_path / "control")
    assert [(s.step, s.ranks, s.slowest_rank, s.step_s, s.tokens, s.loss) for s in history.steps] == [
        (1, 2, 1, 1.5, 8, 0.0), (2, 2, 1, 1.5, 8, 0.0)]
