"""The goodput simulator (slurmtools.requeue.simulate): exact without failures, Young/Daly's
closed form where it applies, the real policy's budget, spares, stragglers, bad input."""
from __future__ import annotations

import math
import random

import pytest

from slurmtools.common.ledger import Cause
from slurmtools.requeue import plan
from slurmtools.requeue.policy import Action
from slurmtools.requeue.simulate import (DAY_S, FailureKind, Scenario, default_mix, format_summary, simulate,
                                         simulate_run)
from slurmtools.spec import RequeueSpec

CRASH_ONLY = (FailureKind("crash", 1.0, Cause.CRASH, 0.0, loses_work=True, names_node=False),)
NODES_ONLY = (FailureKind("node", 1.0, Cause.NODE_FAILURE, 10.0, loses_work=True, names_node=True),)


def _scenario(**overrides) -> Scenario:
    values = dict(nodes=100, failures_per_1000_node_days=0.0, work_days=1.0, checkpoint_interval_s=3600.0,
                  checkpoint_s=36.0, restart_s=60.0, requeue_s=600.0)
    values.update(overrides)
    return Scenario(**values)


def test_without_failures_the_only_cost_is_the_checkpoints():
    run = simulate_run(_scenario(), random.Random(1))
    # 24 h of training in 1-h intervals: 23 checkpoints block it (the run ends where the 24th would be)
    assert (run.work_s, run.wall_s, sum(run.actions.values()), sum(run.failures.values()), run.finished) == (
        DAY_S, DAY_S + 23 * 36.0, 0, 0, True)


def test_with_crashes_alone_it_agrees_with_young_daly():
    job_mtbf_s = 20 * 3600.0
    scenario = _scenario(nodes=1000, failures_per_1000_node_days=DAY_S / job_mtbf_s, work_days=20.0,
                         checkpoint_interval_s=1800.0, checkpoint_s=60.0, restart_s=120.0, kinds=CRASH_ONLY,
                         limits=RequeueSpec(backoff_s=0, max_restarts=1000, max_consecutive_failures=100,
                                            no_progress_restarts=100))
    summary = simulate(scenario, trials=60, seed=3)
    expected = plan.predicted_goodput(1800.0, 60.0, job_mtbf_s, 120.0)
    assert summary.finished_without_person == 1.0
    assert abs(summary.ettr_mean - expected) < 0.005, (summary.ettr_mean, expected)


def test_a_failure_rate_beyond_the_budget_needs_a_person_and_costs_the_wait():
    scenario = _scenario(nodes=1000, failures_per_1000_node_days=20.0, checkpoint_interval_s=600.0, kinds=CRASH_ONLY,
                         limits=RequeueSpec(max_restarts=2, restart_window_h=6))
    summary = simulate(scenario, trials=20, seed=1)
    assert summary.finished_without_person == 0.0 and summary.finished == 1.0
    gentle = simulate(_scenario(nodes=10, failures_per_1000_node_days=1.0, kinds=CRASH_ONLY), trials=20, seed=1)
    assert gentle.finished_without_person == 1.0 and gentle.ettr_mean > summary.ettr_mean + 0.3


def test_a_node_failure_restarts_on_a_spare_and_requeues_without_one():
    kwargs = dict(nodes=1000, failures_per_1000_node_days=5.0, work_days=10.0, kinds=NODES_ONLY,
                  limits=RequeueSpec(max_restarts=1000, no_progress_restarts=100))
    no_spare = simulate(_scenario(**kwargs), trials=20, seed=2)
    spares = simulate(_scenario(spare_nodes=2, **kwargs), trials=20, seed=2)
    assert no_spare.restarts_mean == 0 and no_spare.requeues_mean > 40
    # each requeue brings a fresh allocation with its spares: most failures stay in the allocation
    assert spares.restarts_mean > 2 * spares.requeues_mean and spares.ettr_mean > no_spare.ettr_mean


def test_a_node_failure_recovered_in_place_costs_its_own_time_instead_of_detection_and_relaunch():
    kwargs = dict(nodes=1000, failures_per_1000_node_days=5.0, work_days=10.0, kinds=NODES_ONLY, spare_nodes=2,
                  limits=RequeueSpec(max_restarts=1000, no_progress_restarts=100))
    relaunched = simulate_run(_scenario(**kwargs), random.Random(3))
    in_place = simulate_run(_scenario(in_place_s=4.0, **kwargs), random.Random(3))
    restarts = relaunched.actions[Action.RESTART]
    assert restarts > 10 and in_place.actions[Action.RESTART] == restarts     # the same failures, the same verdicts
    # each restart: 10 s of detection + 60 s of relaunch, or 4 s in all
    assert relaunched.wall_s - in_place.wall_s == pytest.approx(restarts * (10.0 + 60.0 - 4.0))
    with pytest.raises(ValueError, match="costs and the snapshot interval must be >= 0"):
        _scenario(in_place_s=-1.0)


def test_a_crash_restarted_in_place_costs_its_own_time_and_a_node_failure_is_not_one():
    crashes = (FailureKind("crash", 1.0, Cause.CRASH, 1.0, loses_work=True, names_node=False),)
    kwargs = dict(nodes=1000, failures_per_1000_node_days=5.0, work_days=10.0, kinds=crashes,
                  limits=RequeueSpec(max_restarts=1000, no_progress_restarts=100, max_consecutive_failures=100))
    relaunched = simulate_run(_scenario(**kwargs), random.Random(3))
    in_place = simulate_run(_scenario(crash_in_place_s=4.5, **kwargs), random.Random(3))
    restarts = relaunched.actions[Action.RESTART]
    assert restarts > 10 and in_place.actions[Action.RESTART] == restarts
    # each restart: 1 s of detection + 60 s of relaunch, or 4.5 s in all
    assert relaunched.wall_s - in_place.wall_s == pytest.approx(restarts * (1.0 + 60.0 - 4.5))
    nodes = dict(kwargs, kinds=NODES_ONLY, spare_nodes=2)       # a node failure is not a crash's
    assert simulate_run(_scenario(crash_in_place_s=4.5, **nodes), random.Random(3)).wall_s == (
        simulate_run(_scenario(**nodes), random.Random(3)).wall_s)
    with pytest.raises(ValueError, match="costs and the snapshot interval must be >= 0"):
        _scenario(crash_in_place_s=-1.0)


def test_a_hang_whose_node_a_spare_takes_in_place_costs_its_detection_and_its_own_time():
    hangs = (FailureKind("hang", 1.0, Cause.HANG, 30.0, loses_work=True, names_node=True),)
    kwargs = dict(nodes=1000, failures_per_1000_node_days=5.0, work_days=10.0, kinds=hangs, spare_nodes=1000,
                  limits=RequeueSpec(max_restarts=1000, no_progress_restarts=100, max_consecutive_failures=100))
    relaunched = simulate_run(_scenario(**kwargs), random.Random(3))
    in_place = simulate_run(_scenario(hang_in_place_s=3.0, **kwargs), random.Random(3))
    restarts = relaunched.actions[Action.RESTART]
    assert restarts > 10 and in_place.actions[Action.RESTART] == restarts
    # each restart: the 30-s hang timeout either way, then 60 s of relaunch or 3 s in place
    assert relaunched.wall_s - in_place.wall_s == pytest.approx(restarts * (60.0 - 3.0))
    with pytest.raises(ValueError, match="costs and the snapshot interval must be >= 0"):
        _scenario(hang_in_place_s=-1.0)


def test_a_straggler_without_a_spare_slows_the_run_until_its_next_requeue():
    straggler = (FailureKind("straggler", 1.0, Cause.STRAGGLER, 0.0, loses_work=False, names_node=True),)
    kwargs = dict(nodes=1000, failures_per_1000_node_days=1.0, work_days=5.0, kinds=straggler)
    slow = simulate(_scenario(**kwargs), trials=10, seed=4)
    swapped = simulate(_scenario(spare_nodes=10, **kwargs), trials=10, seed=4)
    assert slow.requeues_mean == 0 and slow.ettr_mean < 0.75          # at 1/1.5 speed most of the run
    assert swapped.ettr_mean > 0.95 and swapped.restarts_mean >= 1


def test_a_run_that_can_never_checkpoint_is_given_up_not_simulated_for_ever():
    summary = simulate(_scenario(nodes=1000, failures_per_1000_node_days=2000.0, checkpoint_interval_s=7200.0,
                                 kinds=CRASH_ONLY), trials=2, seed=1)
    assert summary.finished == 0.0 and summary.finished_without_person == 0.0
    assert "finished at all: 0%" in format_summary(summary)


def test_the_default_mix_sums_to_one_and_bad_scenarios_are_refused():
    assert abs(sum(kind.share for kind in default_mix()) - 1.0) < 1e-9
    for bad in (dict(nodes=0), dict(work_days=0.0), dict(checkpoint_interval_s=-1.0),
                dict(failures_per_1000_node_days=-1.0), dict(checkpoint_s=-1.0), dict(straggler_slowdown=0.5),
                dict(kinds=())):
        with pytest.raises(ValueError):
            _scenario(**bad)


SNAPSHOT_LIMITS = RequeueSpec(backoff_s=0, max_restarts=1000, max_consecutive_failures=100,
                              no_progress_restarts=100)


def _lost_per_failure_s(summary) -> float:
    return summary.lost_h_mean * 3600.0 / summary.failures_mean


def _since_checkpoint_s(job_mtbf_s: float, interval_s: float) -> float:
    """Checkpoints alone: the training since the checkpoint when a failure comes (each failure
    returns to the checkpoint, so it is E[X | X < interval] of an exponential X)."""
    decay = math.exp(-interval_s / job_mtbf_s)
    return job_mtbf_s - interval_s * decay / (1.0 - decay)


def test_snapshots_lose_half_an_interval_plus_the_replication_per_restart():
    # a failure at phase x of a 60-s interval loses x, or x + 60 while the newest snapshot's replica
    # is not made (x < 20 s): 60/2 + 20 = 50 s on average (a little less: just after a checkpoint
    # the checkpoint holds what an unreplicated snapshot would)
    kwargs = dict(nodes=1000, failures_per_1000_node_days=24.0, work_days=20.0, checkpoint_interval_s=3600.0,
                  checkpoint_s=0.0, kinds=CRASH_ONLY, limits=SNAPSHOT_LIMITS)
    with_snapshots = simulate(_scenario(snapshot_interval_s=60.0, replication_s=20.0, **kwargs), trials=10, seed=4)
    assert 47.0 < _lost_per_failure_s(with_snapshots) < 50.5, _lost_per_failure_s(with_snapshots)
    only_checkpoints = simulate(_scenario(**kwargs), trials=10, seed=4)
    assert abs(_lost_per_failure_s(only_checkpoints) / _since_checkpoint_s(3600.0, 3600.0) - 1) < 0.03


def test_snapshot_stalls_cost_wall_time_and_sdc_or_a_requeue_falls_back_to_the_checkpoint():
    stalls = simulate_run(_scenario(snapshot_interval_s=60.0, snapshot_s=0.6), random.Random(1))
    assert stalls.work_s == DAY_S and abs(stalls.wall_s - (DAY_S * 1.01 + 23 * 36.0)) < 1e-6
    sdc_only = (FailureKind("sdc", 1.0, Cause.SDC, 0.0, loses_work=True, names_node=True),)
    kwargs = dict(nodes=1000, failures_per_1000_node_days=24.0, work_days=10.0, checkpoint_interval_s=3600.0,
                  checkpoint_s=0.0, spare_nodes=1000, limits=SNAPSHOT_LIMITS, snapshot_interval_s=60.0)
    sdc = simulate(_scenario(kinds=sdc_only, **kwargs), trials=5, seed=2)
    since_checkpoint_s = _since_checkpoint_s(3600.0, 3600.0)      # 1,505 s
    assert sdc.restarts_mean > 200 and abs(_lost_per_failure_s(sdc) / since_checkpoint_s - 1) < 0.05
    no_spare = simulate(_scenario(kinds=NODES_ONLY, **dict(kwargs, spare_nodes=0)), trials=5, seed=2)
    assert no_spare.restarts_mean == 0 and abs(_lost_per_failure_s(no_spare) / since_checkpoint_s - 1) < 0.05
    spares = simulate(_scenario(kinds=NODES_ONLY, **kwargs), trials=5, seed=2)
    assert spares.requeues_mean == 0 and _lost_per_failure_s(spares) < 40.0


def test_with_snapshots_the_budget_counts_their_progress_between_rare_checkpoints():
    # a failure an hour, a checkpoint every 4 hours: checkpoints alone, three failures between two
    # checkpoints are "no newer checkpoint across 3 restarts" and a person is needed; with snapshots
    # each restart restores a newer one, which the budget counts (ledger.progress_step)
    kwargs = dict(nodes=1000, failures_per_1000_node_days=24.0, work_days=10.0, checkpoint_interval_s=4 * 3600.0,
                  checkpoint_s=0.0, kinds=CRASH_ONLY,
                  limits=RequeueSpec(backoff_s=0, max_restarts=1000, max_consecutive_failures=5))
    alone = simulate(_scenario(**kwargs), trials=10, seed=5)
    snapshots = simulate(_scenario(snapshot_interval_s=60.0, **kwargs), trials=10, seed=5)
    # (a few failures that come within one snapshot interval of each other still stop a run: no progress)
    assert alone.finished_without_person == 0.0 and snapshots.finished_without_person >= 0.9


def test_gpu_faults_come_from_llama_3s_figures_and_named_to_their_node_keep_the_run_going():
    from slurmtools.requeue.simulate import GPU_FAULT_SHARE, HARDWARE_SHARE, format_attribution
    assert (GPU_FAULT_SHARE, HARDWARE_SHARE) == (pytest.approx(0.473), 0.78)
    named_mix, unnamed_mix = default_mix(), default_mix(attribute_gpu_faults=False)
    assert [(k.name, k.cause, k.names_node, k.recurs) for k in named_mix[:2]] == [
        ("gpu", Cause.GPU_FATAL, True, False), ("node", Cause.NODE_FAILURE, True, False)]
    assert (unnamed_mix[0].cause, unnamed_mix[0].names_node, unnamed_mix[0].recurs) == (Cause.CRASH, False, True)
    assert sum(k.share for k in named_mix[:2]) == pytest.approx(HARDWARE_SHARE)
    # 9,600 GPUs (1,200 nodes of 8), 8 spares: an unnamed GPU fault fails again on its node, stops at
    # "2 times in a row", and waits for a person
    kwargs = dict(nodes=1200, failures_per_1000_node_days=0.55, work_days=30.0, checkpoint_interval_s=1620.0,
                  checkpoint_s=10.0, restart_s=7.2, requeue_s=60.0, spare_nodes=8)
    named = simulate(_scenario(**kwargs), trials=20, seed=4)
    unnamed = simulate(_scenario(kinds=unnamed_mix, **kwargs), trials=20, seed=4)
    assert named.finished_without_person == 1.0 and unnamed.finished_without_person < 0.2
    assert named.ettr_mean > unnamed.ettr_mean + 0.02
    line = format_attribution(named, unnamed)
    assert line.startswith(f"  GPU faults (47.3% of failures, Llama 3's figure) named to their node: ETTR "
                           f"{named.ettr_mean:.1%}, finished without a person 100%; not named")


@pytest.mark.parametrize("overrides, problem", [
    ({"checkpoint_interval_s": 1e-144}, "the checkpoint interval must be from 1 s to the whole run, got 1e-144 s"),
    ({"snapshot_interval_s": 1e-320}, "the snapshot interval must be from 1 s to the whole run, got 1e-320 s"),
])
def test_an_interval_too_short_to_simulate_is_refused_by_name(overrides, problem):
    """`plan --simulate --checkpoint-cost-s 1e-300` never returned (a Daly interval of 1e-144 s,
    simulated interval by interval); a snapshot interval of 1e-320 s raised OverflowError."""
    with pytest.raises(ValueError, match=problem.replace("(", r"\(")):
        _scenario(**overrides)


def test_a_run_past_its_failure_bound_is_given_up_not_simulated_for_minutes():
    bounded = simulate_run(_scenario(failures_per_1000_node_days=1e6, max_failures=50), random.Random(1))
    assert not bounded.finished and sum(bounded.failures.values()) == 50
