"""Stragglers: per-node local compute per step from the heartbeats, the windows that make a node
a straggler, the decision to swap it out, and how it is recorded. All pure, plus the trainer's
busy timer and heartbeat."""
import json
import time

import pytest

from slurmtools import drain
from slurmtools.errors import SpecError
from slurmtools.requeue import ledger, watchdog
from slurmtools.requeue.policy import Action, AttemptRecord, Capacity, Cause, Evidence, classify, decide
from slurmtools.requeue.straggler import MIN_EXCESS_S, StragglerWatch, window_between
from slurmtools.runtime import HEARTBEAT_DIR, TrainingControl
from slurmtools.spec import RequeueSpec, spec_from_dict

LIMITS = RequeueSpec(max_restarts=1, max_consecutive_failures=1)
HOSTS = {0: "node1", 1: "node1", 2: "node2", 3: "node2", 4: "node3", 5: "node3"}


def beats(step, busy_by_rank, hosts=HOSTS):
    return [watchdog.Beat(rank, hosts[rank], step, 1000.0 + step, busy_s=busy) for rank, busy in busy_by_rank.items()]


class Job:
    """Ranks that each spend `per_step[host]` seconds of local work per step."""

    def __init__(self, per_step, hosts=HOSTS):
        self.per_step, self.hosts, self.step, self.busy = per_step, hosts, 0, {rank: 0.0 for rank in hosts}

    def advance(self, steps, per_step=None):
        for _ in range(steps):
            self.step += 1
            for rank, host in self.hosts.items():
                self.busy[rank] += (per_step or self.per_step)[host]
        return beats(self.step, self.busy, self.hosts)


def test_a_window_compares_each_node_with_the_median_of_the_others():
    start = {b.rank: b for b in beats(10, {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0})}
    end = {b.rank: b for b in beats(20, {0: 2.0, 1: 2.0, 2: 5.0, 3: 4.0, 4: 2.0, 5: 2.0})}
    window = window_between(start, end)
    assert (window.first_step, window.last_step) == (10, 20)
    assert window.busy_per_step_s == pytest.approx({"node1": 0.1, "node2": 0.35, "node3": 0.1})
    assert window.slowdown == {"node1": pytest.approx(0.444, abs=1e-3), "node2": 3.5, "node3": pytest.approx(0.444, abs=1e-3)}


def test_one_node_alone_or_beats_without_busy_times_make_no_window():
    one = {0: watchdog.Beat(0, "node1", 0, 1.0, busy_s=0.0)}
    assert window_between(one, {0: watchdog.Beat(0, "node1", 10, 2.0, busy_s=1.0)}) is None
    watch = StragglerWatch(1.3, 1, 5)
    assert watch.observe([watchdog.Beat(0, "node1", 0, 1.0), watchdog.Beat(2, "node2", 0, 1.0)]) is None
    assert watch.observe([watchdog.Beat(0, "node1", 9, 1.0), watchdog.Beat(2, "node2", 9, 1.0)]) is None


def test_a_node_slow_for_k_windows_in_a_row_is_the_straggler():
    job = Job({"node1": 0.01, "node2": 0.3, "node3": 0.01})
    watch = StragglerWatch(1.3, 3, 5)
    assert watch.observe(job.advance(1)) is None              # the first beats start the first window
    found = []
    for _ in range(3):
        assert watch.observe(job.advance(4)) is None          # not all ranks 5 steps on yet
        window = watch.observe(job.advance(1))
        assert window is not None and window.slowdown["node2"] == pytest.approx(30.0)
        found.append(watch.straggler())
    assert found[:2] == [None, None]
    assert (found[2].node, found[2].windows, found[2].slowdown) == ("node2", 3, pytest.approx(30.0))
    assert found[2].detail == "node=node2 slowdown=30.0x"


def test_a_fast_window_between_slow_ones_starts_the_count_again():
    slow, normal = {"node1": 0.01, "node2": 0.3, "node3": 0.01}, {"node1": 0.01, "node2": 0.01, "node3": 0.01}
    job = Job(slow)
    watch = StragglerWatch(1.3, 2, 5)
    watch.observe(job.advance(1))
    watch.observe(job.advance(5))
    watch.observe(job.advance(5, normal))
    watch.observe(job.advance(5))
    assert watch.straggler() is None
    watch.observe(job.advance(5))
    assert watch.straggler().node == "node2"


def test_a_large_factor_on_a_tiny_step_is_noise_not_a_straggler():
    """2 ms against 1 ms is 2x, but 1 ms per step is below MIN_EXCESS_S."""
    assert MIN_EXCESS_S > 0.001
    job = Job({"node1": 0.001, "node2": 0.002, "node3": 0.001})
    watch = StragglerWatch(1.3, 1, 5)
    watch.observe(job.advance(1))
    assert watch.observe(job.advance(5)).slowdown["node2"] == pytest.approx(2.0)
    assert watch.straggler() is None


def test_below_the_factor_is_no_straggler_and_a_new_rank_set_starts_over():
    job = Job({"node1": 0.1, "node2": 0.12, "node3": 0.1})
    watch = StragglerWatch(1.3, 1, 5)
    watch.observe(job.advance(1))
    watch.observe(job.advance(5))
    assert watch.straggler() is None
    fewer = {rank: host for rank, host in HOSTS.items() if host != "node3"}
    assert watch.observe(beats(job.step + 5, {rank: job.busy[rank] for rank in fewer}, fewer)) is None


def test_evidence_of_a_straggler_swap_is_a_straggler_unless_a_warning_came():
    ev = Evidence(exit_code=0, stopped_for_requeue=True, straggler_node="node2",
                  straggler_detail="node=node2 slowdown=1.6x")
    diag = classify(ev)
    assert (diag.cause, diag.node, diag.detail, diag.fatal_for_node) == (
        Cause.STRAGGLER, "node2", "node=node2 slowdown=1.6x", True)
    assert classify(Evidence(exit_code=None, straggler_node="node2")).cause is Cause.STRAGGLER   # grace ran out
    warned = Evidence(exit_code=0, stopped_for_requeue=True, warning_received=True, straggler_node="node2")
    assert classify(warned).cause is Cause.PREEMPTED


def test_a_straggler_is_swapped_in_place_and_drained_never_counted():
    diag = classify(Evidence(exit_code=0, stopped_for_requeue=True, straggler_node="node2",
                             straggler_detail="node=node2 slowdown=1.6x"))
    spent = [AttemptRecord(Cause.CRASH, True, 4)]                 # the whole budget is used up
    verdict = decide(diag, spent, LIMITS, 8, Capacity(True, frozenset({"node2"})))
    assert (verdict.action, verdict.exclude_node, verdict.drain_node, verdict.counted, verdict.backoff_s) == (
        Action.RESTART, "node2", "node2", False, 0.0)
    fallback = decide(diag, spent, LIMITS, 8, Capacity())
    assert (fallback.action, fallback.exclude_node, fallback.counted) == (Action.REQUEUE, "node2", False)
    reason = drain.DrainReason("CRITICAL", f"job.{diag.cause.value}", diag.detail, "42").render()
    assert reason == "slurmtools: CRITICAL job.straggler node=node2 slowdown=1.6x job=42"


def test_slowdown_records_round_trip_through_the_ledger_and_bad_ones_are_skipped(tmp_path):
    event = ledger.NodeSlowdown("7.0", 1000.0, 10, 20, {"node1": 0.5, "node2": 2.0}, "node2", "swap")
    ledger.append(tmp_path, ledger.AttemptStart("7.0", 999.0))
    ledger.append(tmp_path, event)
    with (tmp_path / ledger.LEDGER_FILE).open("a") as handle:
        handle.write(json.dumps({"event": "slowdown", "attempt_id": "7.0", "time_s": 1.0, "first_step": 1,
                                 "last_step": 2, "slowdown": {"node1": "fast"}}) + "\n")
    events = ledger.read(tmp_path)
    assert events[1:] == [event]
    assert [a.attempt_id for a in ledger.attempts(events)] == ["7.0"]     # no attempt of its own


def test_heartbeats_carry_the_busy_total_and_implausible_ones_are_invalid(tmp_path):
    control = TrainingControl(control_dir=tmp_path, rank=3)
    with control.busy():
        time.sleep(0.05)
    control.heartbeat(5)
    beat = watchdog.read_heartbeats(tmp_path)[0]
    assert beat.step == 5 and 0.05 <= beat.busy_s < 1.0
    now = time.time()
    assert watchdog.parse_heartbeat({"rank": 0, "step": 1, "time": now, "busy_s": -1.0}, now) is None
    assert watchdog.parse_heartbeat({"rank": 0, "step": 1, "time": now, "busy_s": "1"}, now) is None
    assert watchdog.parse_heartbeat({"rank": 0, "step": 1, "time": now}, now).busy_s is None
    assert (tmp_path / HEARTBEAT_DIR / "3.json").exists()


def test_the_straggler_factor_must_be_a_slowdown_or_off():
    with pytest.raises(SpecError, match=r"requeue.straggler_factor: must be above 1 \(a slowdown\), or 0 for off; "
                                        r"got 0.9"):
        spec_from_dict({"name": "x", "command": ["train.py"], "requeue": {"straggler_factor": 0.9}})
    assert spec_from_dict({"name": "x", "command": ["train.py"], "requeue": {"straggler_factor": 0}}
                          ).requeue.straggler_factor == 0
