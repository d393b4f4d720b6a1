"""Stragglers: per-rank local compute per step from the heartbeats, the windows that make a node
a straggler, the decision to swap it out, and how it is recorded. All pure, plus the trainer's
busy timer and heartbeat."""
import json
import random
import statistics
import time

import pytest

from slurmtools.common import ledger
from slurmtools.common.control_dir import HEARTBEAT_DIR
from slurmtools.common.ledger import AttemptRecord, Cause
from slurmtools.errors import SpecError
from slurmtools.requeue import observe, watchdog
from slurmtools.requeue.policy import Action, Capacity, Evidence, classify, decide
from slurmtools.requeue.straggler import (MIN_EXCESS_S, MIN_EXCESS_STEP_FRACTION, Straggler, StragglerWatch,
                                          median_without, window_between)
from slurmtools.slurm import drain
from slurmtools.spec import RequeueSpec, spec_from_dict
from slurmtools.train.control import TrainingControl

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


def test_a_window_compares_each_nodes_slowest_rank_with_the_median_of_the_other_nodes_ranks():
    start = {b.rank: b for b in beats(10, {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0})}
    end = {b.rank: b for b in beats(20, {0: 2.0, 1: 2.0, 2: 5.0, 3: 4.0, 4: 2.0, 5: 2.0})}
    window = window_between(start, end)
    assert (window.first_step, window.last_step, window.step_s) == (10, 20, 1.0)
    assert window.busy_per_step_s == pytest.approx({"node1": 0.1, "node2": 0.4, "node3": 0.1})
    assert window.slowest_rank["node2"] == 2
    # node1 against ranks 2..5 (0.4, 0.3, 0.1, 0.1: median 0.2); node2 against 0, 1, 4, 5 (0.1)
    assert window.others_median_s == pytest.approx({"node1": 0.2, "node2": 0.1, "node3": 0.2})
    assert window.slowdown == {"node1": 0.5, "node2": 4.0, "node3": 0.5}


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
    assert found[2].detail == "node=node2 slowdown=30.0x rank=3"        # ranks 2 and 3 equal: the last


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


def test_a_large_factor_on_a_tiny_excess_is_noise_not_a_straggler():
    """2 ms against 1 ms is 2x, but 1 ms more on a 1-s step is below the floor (5% of the step)."""
    job = Job({"node1": 0.001, "node2": 0.002, "node3": 0.001})
    watch = StragglerWatch(1.3, 1, 5)
    watch.observe(job.advance(1))
    assert watch.observe(job.advance(5)).slowdown["node2"] == pytest.approx(2.0)
    assert watch.straggler() is None


def _gpu_job(step_s, slow_rank, slow_busy_s, normal_busy_s=0.003, nodes=2, per_node=8):
    """nodes x per_node ranks at step_s a step; slow_rank spends slow_busy_s of local work a step."""
    hosts = {rank: f"gpu{rank // per_node + 1}" for rank in range(nodes * per_node)}

    def at(step):
        return [watchdog.Beat(rank, host, step, 1000.0 + step * step_s,
                              busy_s=step * (slow_busy_s if rank == slow_rank else normal_busy_s))
                for rank, host in hosts.items()]
    return at


def test_one_slow_gpu_among_eight_is_found_and_named_by_node_and_rank():
    """6 ms against 3 ms on one GPU of 8 on a 50-ms step: a node's mean would read 1.125x, below
    the factor; per rank it is 2x, and the 3 ms cost 6% of the step (above the 5% floor)."""
    at = _gpu_job(step_s=0.05, slow_rank=11, slow_busy_s=0.006)
    watch = StragglerWatch(1.3, 2, 10)
    watch.observe(at(0))
    windows = [watch.observe(at(10)), watch.observe(at(20))]
    assert [w.slowdown for w in windows] == [{"gpu1": 1.0, "gpu2": 2.0}] * 2
    assert watch.straggler() == Straggler("gpu2", 2.0, 2, 11)
    assert watch.straggler().detail == "node=gpu2 slowdown=2.0x rank=11"


def test_the_same_few_milliseconds_on_a_long_step_are_below_the_relative_floor():
    at = _gpu_job(step_s=5.0, slow_rank=11, slow_busy_s=0.006)
    watch = StragglerWatch(1.3, 1, 10)
    watch.observe(at(0))
    assert watch.observe(at(10)).slowdown["gpu2"] == 2.0
    assert watch.straggler() is None
    assert MIN_EXCESS_STEP_FRACTION * 5.0 > 0.003 > MIN_EXCESS_S


def test_a_whole_slow_node_of_two_is_judged_against_the_other_not_against_itself():
    """On 2 nodes a job-wide median would be half the slow node's own ranks (1.5x: 2 against 1.5 = 1.33x)."""
    at = _gpu_job(step_s=0.5, slow_rank=-1, slow_busy_s=0.0, normal_busy_s=0.1)
    slow = [watchdog.Beat(b.rank, b.host, b.step, b.time_s, busy_s=b.busy_s * (2 if b.host == "gpu2" else 1))
            for b in at(10)]
    window = window_between({b.rank: b for b in at(0)}, {b.rank: b for b in slow})
    assert window.slowdown == {"gpu1": 0.5, "gpu2": 2.0}


@pytest.mark.parametrize("seed", range(20))
def test_the_median_without_some_positions_is_the_median_of_what_is_left(seed):
    rng = random.Random(seed)
    ordered = sorted(rng.choice([0.1, 0.2, 0.3, rng.random()]) for _ in range(rng.randint(2, 40)))
    removed = sorted(rng.sample(range(len(ordered)), rng.randint(0, len(ordered) - 1)))
    left = [value for position, value in enumerate(ordered) if position not in removed]
    assert median_without(ordered, removed) == pytest.approx(statistics.median(left))


def test_a_ledger_record_names_only_the_nodes_at_or_above_the_factor(tmp_path):
    at = _gpu_job(step_s=0.05, slow_rank=11, slow_busy_s=0.006, nodes=4)
    watch = StragglerWatch(1.3, 1, 10)
    reported: list = []
    assert observe.watch_stragglers(tmp_path, "7.0", watch, at(0), lambda node: True, reported) is None
    found = observe.watch_stragglers(tmp_path, "7.0", watch, at(10), lambda node: True, reported)
    assert found == Straggler("gpu2", 2.0, 1, 11) and reported == ["gpu2"]
    records = [r for r in ledger.read(tmp_path) if isinstance(r, ledger.NodeSlowdown)]
    assert [(r.slowdown, r.straggler, r.action) for r in records] == [({"gpu2": 2.0}, "gpu2", "swap")]


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
