"""Whose job, and which nodes it was given: after a requeue the nodes of the runs before count
too (the run after a dead batch host blames it), and the nodes its steps ran on (a dead node the job
gave back before its next step). Slurm's answers are fed in; the commands themselves run in the
cluster tests (test_faults j, test_recovery b)."""
from slurmtools import slurm
from slurmtools.errors import SlurmCommandError


def test_a_requeued_job_owns_the_nodes_of_its_earlier_runs_and_steps(monkeypatch):
    monkeypatch.setattr(slurm, "show_job", lambda job: {"UserId": "alice(64100)", "NodeList": "node[2-3]",
                                                         "Restarts": "1"})
    monkeypatch.setattr(slurm, "sacct_rows", lambda job, fields, all_attempts=False: [
        {"JobID": "7", "NodeList": "node[1-2]"}, {"JobID": "7.batch", "NodeList": "node1"},
        {"JobID": "17", "NodeList": "node9"}, {"JobID": "7", "NodeList": "node[2-3]"}])
    assert slurm.job_owner(7) == (64100, "node[2-3],node[1-2],node1,node[2-3]")


def test_a_job_that_gave_a_dead_node_back_owns_it_through_its_steps(monkeypatch):
    monkeypatch.setattr(slurm, "show_job", lambda job: {"UserId": "alice(64100)", "NodeList": "node[1,3]",
                                                         "Restarts": "0"})
    monkeypatch.setattr(slurm, "sacct_rows", lambda job, fields, all_attempts=False: [
        {"JobID": "7", "NodeList": "node[1-3]"}, {"JobID": "7.0", "NodeList": "node[1-2]"},
        {"JobID": "7.1", "NodeList": "node[1,3]"}])
    assert slurm.job_owner(7) == (64100, "node[1,3],node[1-3],node[1-2],node[1,3]")


def test_a_running_job_is_known_from_slurmctld_when_accounting_does_not_answer(monkeypatch):
    monkeypatch.setattr(slurm, "show_job", lambda job: {"UserId": "alice(64100)", "NodeList": "node[1-2]",
                                                         "Restarts": "0"})

    def refused(*args, **kwargs):
        raise SlurmCommandError(["sacct"], 1, "slurmdbd down")
    monkeypatch.setattr(slurm, "sacct_rows", refused)
    assert slurm.job_owner(7) == (64100, "node[1-2]")


def test_a_finished_job_comes_from_accounting_with_every_run(monkeypatch):
    monkeypatch.setattr(slurm, "show_job", lambda job: None)
    monkeypatch.setattr(slurm, "sacct_rows", lambda job, fields, all_attempts=False: [
        {"JobID": "7", "UID": "64100", "NodeList": "node[1-2]"},
        {"JobID": "7", "UID": "64100", "NodeList": "None assigned"},
        {"JobID": "7", "UID": "64100", "NodeList": "node[2-3]"}])
    assert slurm.job_owner(7) == (64100, "node[1-2],node[2-3]")
    monkeypatch.setattr(slurm, "sacct_rows", lambda job, fields, all_attempts=False: [])
    assert slurm.job_owner(7) is None
