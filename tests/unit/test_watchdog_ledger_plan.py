"""Heartbeat stall detection, the goodput ledger, and the Young/Daly planner."""
import json

import pytest

from slurmtools.common import ledger
from slurmtools.common.ledger import AttemptRecord, Cause
from slurmtools.requeue import goodput, plan, watchdog
from slurmtools.train.control import TrainingControl


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
    g = goodput.goodput(records())
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
    assert "effective training time ratio" in goodput.format_goodput(g)


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


def test_the_budgets_progress_is_the_newer_of_the_checkpoint_and_the_restored_snapshot(tmp_path):
    """Checkpoint 4 throughout; attempts restore from snapshots 6, 9, 9: the first two failures
    progressed, the third did not (it failed again after restoring the same snapshot)."""
    events = [ledger.AttemptStart("7.0", 1.0), ledger.SnapshotRestore("7.0", 1.5, None, "no verified snapshot"),
              ledger.AttemptEnd("7.0", 10.0, cause="crash", counted=True, checkpoint_step=4)]
    for n, (step, end_s) in enumerate([(6, 20.0), (9, 30.0), (9, 40.0)], start=1):
        events += [ledger.AttemptStart(f"7.0.{n}", end_s - 9), ledger.SnapshotRestore(f"7.0.{n}", end_s - 8, step, "s"),
                   ledger.AttemptEnd(f"7.0.{n}", end_s, cause="crash", counted=True, checkpoint_step=4)]
    assert [record.checkpoint_step for record in ledger.history(events)] == [4, 6, 9, 9]
    for event in events:
        ledger.append(tmp_path, event)
    assert ledger.attempt_progress_step(tmp_path, "7.0.2", 4) == 9 and ledger.attempt_progress_step(tmp_path, "7.0", 4) == 4
    assert ledger.progress_step(None, None) is None and ledger.progress_step(12, 9) == 12
    # the policy: restarts that each restored a newer snapshot are no "restarts without progress"
    from slurmtools.requeue import policy
    from slurmtools.spec import RequeueSpec
    crash = policy.Diagnosis(Cause.CRASH, detail="exit 1")
    capacity = policy.Capacity(in_allocation=True)
    history = ledger.history(events)
    limits = RequeueSpec(no_progress_restarts=3, max_consecutive_failures=5, max_restarts=100)
    assert policy.decide(crash, history[:3], limits, 10, capacity).action is policy.Action.RESTART
    stuck = policy.decide(crash, history, limits, 9, capacity)
    assert stuck.action is policy.Action.STOP and "no newer checkpoint across 3 restarts" in stuck.reason


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


def test_a_rank_saving_within_its_phase_deadline_is_no_hang_and_past_it_is_the_laggard(tmp_path):
    """A 20-minute save at a 600-s hang timeout: rank 0 commits while the others wait in the
    next step's collective. No stall until the phase's own deadline; then rank 0 is the laggard."""
    saving = watchdog.Beat(0, "node1", 8, 1000.0, phase="saving", phase_until_s=3000.0, phase_t_s=1000.0)
    waiting = [beat(1, 9, 1001.0), beat(2, 9, 1001.0)]
    assert watchdog.judge([saving] + waiting, now_s=2200.0, timeout_s=600) is None
    stall = watchdog.judge([saving] + waiting, now_s=3001.0, timeout_s=600)
    assert (stall.rank, stall.host, stall.step) == (0, "node1", 8)


def test_a_phase_just_ended_counts_as_work_not_as_idle_time():
    done = watchdog.Beat(0, "node1", 8, 1000.0, phase_t_s=2199.0)    # the save ended a second ago
    assert watchdog.judge([done, beat(1, 9, 1001.0)], now_s=2200.0, timeout_s=600) is None
    assert watchdog.judge([done, beat(1, 9, 1001.0)], now_s=2800.0, timeout_s=600).rank == 0


def test_the_heartbeat_says_the_phase_from_before_the_first_step_and_drops_it_after(tmp_path):
    control = TrainingControl(control_dir=tmp_path, rank=1, heartbeat_interval_s=3600)
    with control.phase("verifying", timeout_s=50):
        (inside,) = watchdog.read_heartbeats(tmp_path)
        assert (inside.phase, inside.step, inside.first_progress_s) == ("verifying", 0, None)
        assert inside.phase_until_s == pytest.approx(inside.phase_t_s + 50, abs=1)
    (after,) = watchdog.read_heartbeats(tmp_path)
    assert (after.phase, after.phase_until_s) == ("", None) and after.phase_t_s >= inside.phase_t_s
    control.heartbeat(4)
    (stepped,) = watchdog.read_heartbeats(tmp_path)
    assert (stepped.step, stepped.phase_t_s) == (4, None)


@pytest.mark.parametrize("field,value", [("phase", "x" * 33), ("phase", 5), ("phase_until", "soon"),
                                         ("phase_until", 1e30), ("phase_t", -1)])
def test_an_implausible_phase_makes_the_heartbeat_invalid(field, value):
    data = {"rank": 0, "step": 1, "time": 100.0, "phase": "saving", "phase_until": 200.0, field: value}
    assert watchdog.parse_heartbeat(data, now_s=150.0) is None


@pytest.mark.parametrize("stopped_by, cause, counted", [("77.0", "preempted", False), ("76.0", "crash", True),
                                                        (None, "crash", True)])
def test_an_attempt_whose_supervisor_was_killed_is_closed_as_its_ranks_left_it(tmp_path, monkeypatch, stopped_by,
                                                                               cause, counted):
    """Slurm SIGKILLs the supervisor KillWait after a requeue's SIGTERM, and on a loaded node that can
    come before the ranks' exit reaches it: ranks that had stopped for the requeue (rank 0's marker,
    of this attempt) make the end a preemption, not counted; without the marker it is a crash."""
    from slurmtools.requeue import slurm_view
    from slurmtools.common.control_dir import STOPPED_FILE
    monkeypatch.setattr(slurm_view, "node_states", lambda nodelist: {"node1": "allocated", "node2": "allocated"})
    ledger.append(tmp_path, ledger.AttemptStart("77.0", 1000.0, 0, "node[1-2]", None))
    if stopped_by is not None:
        (tmp_path / STOPPED_FILE).write_text(json.dumps({"step": 6, "attempt_id": stopped_by}))
    end = slurm_view.close_dangling_attempt(tmp_path, ledger.read(tmp_path), 6)
    assert end is not None and (end.attempt_id, end.cause, end.counted, end.action, end.node) == (
        "77.0", cause, counted, "requeue", None)
    assert [e for e in ledger.read(tmp_path) if isinstance(e, ledger.AttemptEnd)] == [end]


@pytest.mark.parametrize("states, cause, counted", [
    ({"node1": "allocated", "node2": "allocated"}, "preempted", False),
    ({"node1": "allocated", "node2": "down"}, "node_failure", True),      # Slurm's SIGTERM for a node failure
])
def test_a_sigterm_recorded_before_the_save_makes_a_killed_supervisors_attempt_a_preemption(tmp_path, monkeypatch,
                                                                                           states, cause, counted):
    """A preemption or a person's requeue whose save outlasts KillWait: the supervisor is SIGKILLed
    before the ranks stop, so no stopped marker; its record of the SIGTERM, written the moment it
    came, still makes the attempt not counted (two counted ones with no newer checkpoint stopped the job)."""
    from slurmtools.requeue import observe, slurm_view, step
    monkeypatch.setattr(slurm_view, "node_states", lambda nodelist: states)
    ledger.append(tmp_path, ledger.AttemptStart("78.0", 1000.0, 0, "node[1-2]", None))
    observe.record_term(tmp_path, "78.0", 1010.0)
    assert step.term_received_by(tmp_path, "78.0") and not step.term_received_by(tmp_path, "78.1")
    end = slurm_view.close_dangling_attempt(tmp_path, ledger.read(tmp_path), 6)
    assert end is not None and (end.cause, end.counted) == (cause, counted)
    assert ("SIGTERM had come" in end.detail) is (not counted)
    step.prepare_control_dir(tmp_path)                                   # the next attempt starts clean
    assert not step.term_received_by(tmp_path, "78.0")


@pytest.mark.parametrize("phase, until, end_s, expired", [
    ("saving", 2000.0, None, False),          # a straggler swap's save still writing, no end in sight: not killed
    ("saving", 2000.0, 5000.0, False),        # the job's end far off
    ("saving", 2000.0, 1150.0, True),         # the end nearer than the grace: Slurm's KillWait would come first
    ("saving", 1100.0, None, True),           # past its save's own deadline
    ("", None, None, True),                   # nobody saving: the ranks never reached a step boundary
])
def test_a_requested_save_still_writing_is_not_killed_while_the_jobs_time_is_not_up(phase, until, end_s, expired):
    beats = [watchdog.Beat(0, "node1", 8, 1190.0, phase=phase, phase_until_s=until, phase_t_s=1000.0),
             watchdog.Beat(1, "node2", 8, 1190.0)]
    assert not watchdog.grace_expired(1100.0, 1000.0, 120.0, end_s, beats)          # within the grace
    assert watchdog.grace_expired(1200.0, 1000.0, 120.0, end_s, beats) is expired
