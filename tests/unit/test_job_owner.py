"""Whose job, and which nodes it was given: after a requeue the nodes of the runs before count
too (the run after a dead batch host blames it). Slurm's answers are fed in; the commands
themselves run in the cluster tests (test_faults j)."""
from slurmtools import slurm


def test_a_requeued_job_owns_the_nodes_of_its_earlier_runs(monkeypatch):
    monkeypatch.setattr(slurm, "show_job", lambda job: {"UserId": "alice(64100)", "NodeList": "node[2-3]",
                                                         "Restarts": "1"})
    monkeypatch.setattr(slurm, "sacct_rows", lambda job, fields, all_attempts=False: [
        {"JobID": "7", "NodeList": "node[1-2]"}, {"JobID": "7.batch", "NodeList": "node1"},
        {"JobID": "7", "NodeList": "node[2-3]"}])
    assert slurm.job_owner(7) == (64100, "node[2-3],node[1-2],node[2-3]")


def test_a_job_never_requeued_asks_only_slurmctld(monkeypatch):
    monkeypatch.setattr(slurm, "show_job", lambda job: {"UserId": "alice(64100)", "NodeList": "node[1-2]",
                                                         "Restarts": "0"})
    monkeypatch.setattr(slurm, "sacct_rows", lambda *a, **k: (_ for _ in ()).throw(AssertionError("asked")))
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
