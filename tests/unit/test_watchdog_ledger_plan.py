"""Heartbeat stall detection, the goodput ledger, and the Young/Daly planner."""
import json

import pytest

from slurmtools.requeue import ledger, plan, watchdog
from slurmtools.requeue.policy import AttemptRecord, Cause
from slurmtools.runtime import TrainingControl


def beat(rank, step, t, host=None):
    return watchdog.Beat(rank, host or f"node{rank // 2 + 1}", step, t)


def test_no_stall_while_recent():
    assert watchdog.judge([beat(0, 5, 100.0), beat(1, 5, 100.0)], now_s=105.0, timeout_s=10) is None


def test_stall_with_single_laggard_names_rank_and_host():
    beats = [beat(0, 6, 100.0), beat(1, 6, 100.0), beat(2, 5, 99.0), beat(3, 6, 100.2)]
    stall = watchdog.judge(beats, now_s=120.0, timeout_s=15)
    assert (stall.rank, stall.host, stall.step) == (2, "node2", 5)
    assert stall.idle_s == pytest.approx(19.8)


def test_stall_without_single_laggard_is_unattributed():
    stall = watchdog.judge([beat(0, 5, 100.0), beat(1, 5, 100.0)], now_s=200.0, timeout_s=15)
    assert (stall.rank, stall.host) == (None, None)


def test_watchdog_off_and_no_beats():
    assert watchdog.judge([beat(0, 1, 0.0)], now_s=1e9, timeout_s=0) is None
    assert watchdog.judge([], now_s=1e9, timeout_s=10) is None


def test_heartbeat_files_roundtrip(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURMTOOLS_ATTEMPT_ID", "9.2")
    c = TrainingControl(control_dir=tmp_path, rank=3)
    c.heartbeat(7)
    (tmp_path / "heartbeat" / "junk.json").write_text("{half")
    beats = watchdog.read_heartbeats(tmp_path)
    assert [(b.rank, b.step) for b in beats] == [(3, 7)]
    data = json.loads((tmp_path / "heartbeat" / "3.json").read_text())
    assert data["attempt_id"] == "9.2"


def test_heartbeat_written_on_every_new_step(tmp_path):
    c = TrainingControl(control_dir=tmp_path, rank=0, heartbeat_interval_s=3600)
    c.heartbeat(1)
    c.heartbeat(2)
    assert watchdog.read_heartbeats(tmp_path)[0].step == 2


def records():
    return [
        ledger.AttemptStart("5.0", 0.0, resume_step=None),
        ledger.AttemptEnd("5.0", 100.0, cause="hang", counted=True, last_step=40, checkpoint_step=30,
                          first_step_t=10.0, node="node2"),
        ledger.AttemptStart("5.1", 112.0, resume_step=30),
        ledger.AttemptEnd("5.1", 200.0, cause="preempted", counted=False, last_step=60, checkpoint_step=60,
                          first_step_t=122.0),
        ledger.AttemptStart("5.2", 211.0, resume_step=60),
        ledger.AttemptEnd("5.2", 291.0, cause="completed", counted=False, last_step=100, checkpoint_step=100,
                          first_step_t=221.0),
    ]


def test_goodput_from_ledger():
    g = ledger.goodput(records())
    assert g.attempts == 3 and g.failures == 1 and g.preemptions == 1
    assert g.final_step == 100
    assert g.wall_s == 291.0
    assert g.steps_lost == [10, 0]
    # without the last step's time (an older ledger): from the attempt's end to the next first step
    assert g.restart_latency_s == [22.0, 21.0]
    assert g.time_to_first_step_s == [10.0, 10.0, 10.0]
    # per-attempt step times: 90/39, 78/29, 70/39 -> median 70/39
    assert g.step_time_s == pytest.approx(90 / 39)
    assert g.ratio == pytest.approx(100 * (90 / 39) / 291.0)
    assert "effective training time ratio" in ledger.format_goodput(g)


def test_ledger_append_read_and_history(tmp_path):
    for r in records():
        ledger.append(tmp_path, r)
    with open(tmp_path / ledger.LEDGER_FILE, "a") as fh:
        fh.write('{"event": "start", "attempt_id": "torn')      # a killed writer's last line
    assert ledger.read(tmp_path) == records()
    assert ledger.history(ledger.read(tmp_path)) == [
        AttemptRecord(Cause.HANG, True, 30, "node2", 100.0), AttemptRecord(Cause.PREEMPTED, False, 60, None, 200.0),
        AttemptRecord(Cause.COMPLETED, False, 100, None, 291.0)]
    assert ledger.ever_trained(ledger.read(tmp_path))
    assert not ledger.ever_trained([ledger.AttemptStart("6.0", 1.0, resume_step=30),
                                    ledger.AttemptEnd("6.0", 9.0, cause="crash", last_step=30)])


def test_plan_for_the_seed_cluster():
    p = plan.plan(checkpoint_cost_s=30, nodes=8, node_mtbf_h=200, restart_cost_s=300)
    assert p.job_mtbf_s == 25 * 3600
    assert p.young_interval_s == pytest.approx((2 * 30 * 90000) ** 0.5)
    assert 0.96 < p.goodput < 0.98
    assert p.goodput >= max(g for _, g in p.table) - 1e-9


@pytest.mark.parametrize("kw,msg", [({"checkpoint_cost_s": 0}, "checkpoint cost"), ({"nodes": 0}, "nodes"),
                                    ({"node_mtbf_h": 0}, "MTBF")])
def test_plan_rejects_nonsense(kw, msg):
    args = dict(checkpoint_cost_s=30, nodes=8, node_mtbf_h=100)
    args.update(kw)
    with pytest.raises(ValueError, match=msg):
        plan.plan(**args)


def test_first_progress_survives_heartbeat_overwrites(tmp_path):
    """Heartbeat files are rewritten every step; the first-progress time must not move with them."""
    c = TrainingControl(control_dir=tmp_path, rank=0, heartbeat_interval_s=0)
    c.heartbeat(10)                       # resumed at step 10: no progress yet
    assert watchdog.first_progress(watchdog.read_heartbeats(tmp_path)) is None
    c.heartbeat(11)
    first = watchdog.first_progress(watchdog.read_heartbeats(tmp_path))
    c.heartbeat(12)
    c.heartbeat(13)
    beats = watchdog.read_heartbeats(tmp_path)
    assert beats[0].step == 13 and watchdog.first_progress(beats) == first
