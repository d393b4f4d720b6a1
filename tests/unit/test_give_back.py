"""A restart in the allocation after a node died gives the dead node back first (the job shrunk by
it), so that Slurm's own removal of it, when it marks it down later, cannot land on the next step's
launch. Slurm's answers are fed in; the shrink itself runs in the cluster tests (test_recovery b,
test_scale)."""
import json
import signal

import pytest

from slurmtools.common.signals import SignalFlags
from slurmtools.errors import SlurmCommandError
from slurmtools.requeue import actions, policy, topology
from slurmtools.slurm import commands as slurm
from slurmtools.spec import RequeueSpec


def _commands(monkeypatch, node_list="node[1-4]"):
    calls = []
    monkeypatch.setattr(slurm, "show_job", lambda job: {"NodeList": node_list, "UserId": "alice(64100)"})

    def run_once(argv, timeout_s, input_text, env, survive_sigterm):
        calls.append((list(argv), env))
        return ""
    monkeypatch.setattr(slurm, "_run_once", run_once)
    return calls


def test_the_job_keeps_the_rest_and_scontrol_writes_no_resize_files(monkeypatch):
    monkeypatch.setenv("SLURM_JOBID", "7")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    calls = _commands(monkeypatch)
    assert slurm.give_back_nodes(7, ["node2"]) == "node[1,3-4]"
    (argv, env), = calls
    assert argv == ["scontrol", "update", "JobId=7", "NodeList=node[1,3-4]"]
    assert "SLURM_JOBID" not in env and "SLURM_JOB_ID" not in env and env["PATH"]


def test_a_node_no_longer_the_jobs_is_not_given_back_again(monkeypatch):
    calls = _commands(monkeypatch, node_list="node[1,3-4]")
    assert slurm.give_back_nodes(7, ["node2"]) is None
    assert calls == []


def test_nodes_slurm_removed_itself_meanwhile_are_not_an_error(monkeypatch):
    answers = iter(["node[1-4]", "node[1,3-4]"])
    monkeypatch.setattr(slurm, "show_job", lambda job: {"NodeList": next(answers)})

    def refused(argv, timeout_s, input_text, env, survive_sigterm):
        raise SlurmCommandError(argv, 1, "Invalid node name specified")
    monkeypatch.setattr(slurm, "_run_once", refused)
    assert slurm.give_back_nodes(7, ["node2"]) is None


def test_a_refusal_while_the_job_still_holds_the_node_is_raised(monkeypatch):
    monkeypatch.setattr(slurm, "show_job", lambda job: {"NodeList": "node[1-4]"})

    def refused(argv, timeout_s, input_text, env, survive_sigterm):
        raise SlurmCommandError(argv, 1, "Access/permission denied")
    monkeypatch.setattr(slurm, "_run_once", refused)
    with pytest.raises(SlurmCommandError, match="permission denied"):
        slurm.give_back_nodes(7, ["node2"])


def _restart(monkeypatch, capsys, diag, verdict, give_back=None):
    monkeypatch.setattr(actions, "drain_node", lambda *args, **kwargs: None)
    monkeypatch.setattr(actions.step, "kill_steps", lambda job_id: (["7.3"], []))
    given = []

    def shrink(job_id, nodes):
        given.append((job_id, list(nodes)))
        if give_back is not None:
            raise give_back
        return "node[1,3-4]"
    monkeypatch.setattr(slurm, "give_back_nodes", shrink)
    run = actions.Run(topology.topology_of(["node1", "node2", "node3", "node4"], RequeueSpec(spare_nodes=1)))
    flags = SignalFlags().install({signal.SIGUSR2})
    assert actions.restart_in_allocation(7, "7.0", run, diag, verdict, flags)
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return given, {e["slurmtools"]: e for e in events}, run


def test_a_dead_node_is_given_back_before_the_next_step(monkeypatch, capsys):
    diag = policy.Diagnosis(policy.Cause.NODE_FAILURE, node="node2", detail="silent", fatal_for_node=True)
    verdict = policy.Verdict(policy.Action.RESTART, "node failure", exclude_node="node2", drain_node="node2")
    given, events, run = _restart(monkeypatch, capsys, diag, verdict)
    assert given == [(7, ["node2"])]
    assert (events["give_back"]["nodes"], events["give_back"]["applied"]) == (["node2"], True)
    assert list(events) == ["give_back", "replace_node", "restart"]
    assert run.stuck_steps == {"7.3"}       # open for good in Slurm's books: the next step does not wait for it


def test_a_straggler_stays_in_the_job(monkeypatch, capsys):
    diag = policy.Diagnosis(policy.Cause.STRAGGLER, node="node2", detail="2.2x")
    verdict = policy.Verdict(policy.Action.RESTART, "straggler", exclude_node="node2", drain_node="node2")
    given, events, run = _restart(monkeypatch, capsys, diag, verdict)
    assert given == [] and "give_back" not in events
    assert run.stuck_steps == set()         # its step ends: the next one waits for it (step.wait_steps_ended)


def test_a_refused_shrink_is_reported_and_the_restart_goes_on(monkeypatch, capsys):
    diag = policy.Diagnosis(policy.Cause.NODE_FAILURE, node="node2", detail="silent", fatal_for_node=True)
    verdict = policy.Verdict(policy.Action.RESTART, "node failure", exclude_node="node2", drain_node="node2")
    given, events, _ = _restart(monkeypatch, capsys, diag, verdict,
                             give_back=SlurmCommandError(["scontrol"], 1, "Access/permission denied"))
    assert given == [(7, ["node2"])] and "give_back" not in events
    assert events["give_back_failed"]["nodes"] == ["node2"] and "permission denied" in events["give_back_failed"]["error"]
    assert "restart" in events


def test_a_step_with_overlap_waits_for_the_old_steps_but_not_for_those_stuck_on_a_dead_node(monkeypatch):
    """--overlap lets a step start beside the old one: a hung step's ranks still tearing down
    their CUDA contexts would leave the new ranks without GPU memory. Waited for until they end
    (bounded), but never for a step stuck open on a dead node."""
    from slurmtools.requeue import step
    listings = iter([["7.3", "7.4"], ["7.3", "7.4"], ["7.3"]])
    monkeypatch.setattr(slurm, "job_steps", lambda job_id: next(listings))
    assert step.wait_steps_ended(7, {"7.3"}, timeout_s=5, poll_s=0.01) == []
    with pytest.raises(StopIteration):
        next(listings)                       # asked until 7.4 had ended
    monkeypatch.setattr(slurm, "job_steps", lambda job_id: ["7.4"])
    assert step.wait_steps_ended(7, set(), timeout_s=0.05, poll_s=0.01) == ["7.4"]     # bounded

    def down(job_id):
        raise SlurmCommandError(["squeue"], 1, "Unable to contact slurm controller")
    monkeypatch.setattr(slurm, "job_steps", down)
    assert step.wait_steps_ended(7, set(), timeout_s=5, poll_s=0.01) == []
