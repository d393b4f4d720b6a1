"""A job's own requeue rides through a controller outage of minutes (the retry loop with a fake
clock; the real controller restart is a cluster test)."""
import pytest

from slurmtools import slurm
from slurmtools.spec import RequeueSpec

DOWN = "scontrol: error: Unable to contact slurm controller (connect failure)"


class Clock:
    def __init__(self):
        self.now_s = 0.0

    def monotonic(self):
        return self.now_s

    def sleep(self, seconds):
        self.now_s += seconds


def controller_down_for(outage_s, clock, calls):
    def run_once(argv, *rest):
        calls.append(clock.now_s)
        if clock.now_s < outage_s:
            raise slurm.SlurmCommandError(argv, 1, DOWN)
        return "ok"
    return run_once


def test_the_requeue_commands_ride_through_a_two_minute_outage(monkeypatch):
    clock, calls = Clock(), []
    monkeypatch.setattr(slurm, "time", clock)
    monkeypatch.setattr(slurm, "_run_once", controller_down_for(120.0, clock, calls))
    slurm.requeue_excluding(7, {"ExcNodeList": "node2"})
    assert calls[-1] >= 120.0 and len(calls) >= 3
    calls.clear()
    clock.now_s = 0.0
    slurm.requeue(7)
    assert calls[-1] >= 120.0


def test_other_commands_give_up_after_the_short_retries(monkeypatch):
    clock, calls = Clock(), []
    monkeypatch.setattr(slurm, "time", clock)
    monkeypatch.setattr(slurm, "_run_once", controller_down_for(120.0, clock, calls))
    with pytest.raises(slurm.SlurmCommandError):
        slurm.run_slurm(["squeue"])
    assert len(calls) == len(slurm.RETRY_DELAYS_S) + 1 and calls[-1] == sum(slurm.RETRY_DELAYS_S)


def test_an_outage_longer_than_the_ride_fails_the_requeue(monkeypatch):
    clock, calls = Clock(), []
    monkeypatch.setattr(slurm, "time", clock)
    monkeypatch.setattr(slurm, "_run_once", controller_down_for(1e9, clock, calls))
    with pytest.raises(slurm.SlurmCommandError):
        slurm.requeue(7)
    assert slurm.REQUEUE_OUTAGE_S <= calls[-1] < slurm.REQUEUE_OUTAGE_S + 10


def test_the_exclusion_list_read_before_a_requeue_rides_the_outage_too(monkeypatch):
    """requeue_fields reads the job's ExcNodeList before the requeue: during an outage it waits as
    the requeue does, instead of failing the requeue after the short retries."""
    from slurmtools.requeue import actions, policy, topology

    clock, calls = Clock(), []
    monkeypatch.setattr(slurm, "time", clock)
    monkeypatch.setattr(slurm, "_run_once", controller_down_for(120.0, clock, calls))
    monkeypatch.setattr(slurm, "parse_scontrol_record", lambda line: {"ExcNodeList": "node5"})
    run = actions.Run(topology.topology_of(["node1", "node2"], RequeueSpec()))
    verdict = policy.Verdict(policy.Action.REQUEUE, "node failure", exclude_node="node2", drain_node="node2")
    assert actions.requeue_fields(7, verdict, run) == {"ExcNodeList": "node[2,5]"}
    assert calls[-1] >= 120.0
