"""A job's own requeue rides through a controller outage of minutes (the retry loop with a fake
clock; the real controller restart is a cluster test)."""
import pytest

from slurmtools.slurm import commands as slurm
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


def test_our_exclusions_age_out_of_the_requeues_list_and_the_users_own_stay(monkeypatch):
    """Over weeks the exclusion list only grew (hang and straggler blames too) until the job could
    pend for ever: this job's exclusions last a time by cause; a node the user excluded stays."""
    from slurmtools.requeue import actions, exclusions, policy, topology
    from slurmtools.common import ledger

    hour = 3600.0
    events = [ledger.AttemptEnd("7.0", 0.0, "hang", excluded="node3"),
              ledger.AttemptEnd("7.1", 1 * hour, "straggler", excluded="node4"),
              ledger.AttemptEnd("7.2", 2 * hour, "node_failure", excluded="node5,node6"),
              ledger.AttemptEnd("7.3", 3 * hour, "crash")]
    assert exclusions.excluded_until(events) == {"node3": 6 * hour, "node4": 7 * hour, "node5": 74 * hour,
                                                 "node6": 74 * hour}
    assert exclusions.expired(events, 6.5 * hour) == frozenset({"node3"})
    assert exclusions.expired(events, 80 * hour) == frozenset({"node3", "node4", "node5", "node6"})
    # blamed again later: the later exclusion counts
    again = events + [ledger.AttemptEnd("7.4", 10 * hour, "hang", excluded="node3")]
    assert "node3" not in exclusions.expired(again, 8 * hour)

    monkeypatch.setattr(slurm, "show_job", lambda job_id, **kw: {"ExcNodeList": "node[1,3-6]"})
    run = actions.Run(topology.topology_of(["node7", "node8"], RequeueSpec()),
                      expired_exclusions=exclusions.expired(events, 6.5 * hour))
    verdict = policy.Verdict(policy.Action.REQUEUE, "hang", exclude_node="node8")
    assert actions.requeue_fields(7, verdict, run) == {"ExcNodeList": "node[1,4-6,8]"}    # node1: the user's


def test_the_decision_records_the_nodes_it_excluded_in_the_ledger(tmp_path):
    from slurmtools.common import ledger
    ledger.append(tmp_path, ledger.AttemptEnd("7.0", 1.0, "node_failure", excluded="node2,node3"))
    assert [e.excluded for e in ledger.read(tmp_path) if isinstance(e, ledger.AttemptEnd)] == ["node2,node3"]


def test_a_requeue_with_an_exclusion_is_requeue_then_update_never_a_hold(monkeypatch):
    """Issue 46: `requeuehold -> update -> release` ran inside KillWait; a supervisor killed before
    the release left its job held for good. Requeue first, then update (accepted while the job
    completes, before its begin time: docs/minicluster.md): a kill in between leaves a plain requeue."""
    asked = []
    monkeypatch.setattr(slurm, "_run_once", lambda argv, *rest: asked.append(list(argv)) or "")
    slurm.requeue_excluding(7, {"ExcNodeList": "node2", "StartTime": "now+5"})
    assert asked == [["scontrol", "requeue", "7"],
                     ["scontrol", "update", "JobId=7", "ExcNodeList=node2", "StartTime=now+5"]]


def test_a_command_a_busy_controller_cut_off_with_sigpipe_is_run_again(monkeypatch, tmp_path):
    """A real process killed by SIGPIPE once (as scontrol is when slurmctld closes its connection
    while it writes), then answering: retried like a refused connection; a plain failure is not."""
    clock = Clock()
    monkeypatch.setattr(slurm, "time", clock)
    marker = tmp_path / "cut-off-once"
    script = tmp_path / "scontrol"
    script.write_text(f"#!/bin/bash\nif [ ! -e {marker} ]; then touch {marker}; kill -PIPE $$; fi\necho answered\n")
    script.chmod(0o755)
    assert slurm.run_slurm([str(script), "-o", "show", "job", "7"]) == "answered\n"
    assert clock.now_s == slurm.RETRY_DELAYS_S[0]
    failing = tmp_path / "failing"
    failing.write_text("#!/bin/bash\necho 'Invalid job id specified' >&2\nexit 1\n")
    failing.chmod(0o755)
    with pytest.raises(slurm.SlurmCommandError, match="Invalid job id"):
        slurm.run_slurm([str(failing)])
    assert clock.now_s == slurm.RETRY_DELAYS_S[0]
