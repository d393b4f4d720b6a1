"""Whose job, and which nodes it was given: after a requeue the nodes of the runs before count
too (the run after a dead batch host blames it), and the nodes its steps ran on (a dead node the job
gave back before its next step). Only fields no user writes, each asked by name (squeue's numeric
uid and node list, sacct's JobID, UID, NodeList, End): Slurm's answers are fed in; the commands
themselves run in the cluster tests (test_faults j, test_recovery b, test_blame)."""
from slurmtools.errors import SlurmCommandError
from slurmtools.slurm import commands as slurm
from slurmtools.slurm.parse import parse_time


def rows(*lines: str):
    fields = ("JobID", "UID", "NodeList", "End")
    return lambda job, asked, all_attempts=False: [dict(zip(fields, line.split("|"))) for line in lines]


def live(answer):
    return lambda job: answer


def test_a_requeued_job_owns_the_nodes_of_its_earlier_runs_and_steps(monkeypatch):
    monkeypatch.setattr(slurm, "live_job_owner", live((64100, "node[2-3]")))
    monkeypatch.setattr(slurm, "sacct_rows", rows(
        "7|64100|node[1-2]|2026-12-04T10:00:00", "7.batch||node1|2026-12-04T10:00:00",
        "17|64100|node9|Unknown", "7|64100|node[2-3]|Unknown"))
    assert slurm.job_owner(7) == (64100, "node[2-3],node[1-2],node1,node[2-3]", None)


def test_a_job_that_gave_a_dead_node_back_owns_it_through_its_steps(monkeypatch):
    monkeypatch.setattr(slurm, "live_job_owner", live((64100, "node[1,3]")))
    monkeypatch.setattr(slurm, "sacct_rows", rows(
        "7|64100|node[1-3]|Unknown", "7.0||node[1-2]|2026-12-04T10:00:00", "7.1||node[1,3]|Unknown"))
    assert slurm.job_owner(7) == (64100, "node[1,3],node[1-3],node[1-2],node[1,3]", None)


def test_a_running_job_is_known_from_slurmctld_when_accounting_does_not_answer(monkeypatch):
    monkeypatch.setattr(slurm, "live_job_owner", live((64100, "node[1-2]")))

    def refused(*args, **kwargs):
        raise SlurmCommandError(["sacct"], 1, "slurmdbd down")
    monkeypatch.setattr(slurm, "sacct_rows", refused)
    assert slurm.job_owner(7) == (64100, "node[1-2]", None)


def test_a_finished_job_comes_from_accounting_with_every_run_and_when_it_ended(monkeypatch):
    monkeypatch.setattr(slurm, "live_job_owner", live(None))
    monkeypatch.setattr(slurm, "sacct_rows", rows(
        "7|64100|node[1-2]|2026-12-04T09:00:00", "7|64100|None assigned|2026-12-04T09:30:00",
        "7|64100|node[2-3]|2026-12-04T10:00:00"))
    assert slurm.job_owner(7) == (64100, "node[1-2],node[2-3]", parse_time("2026-12-04T10:00:00"))
    monkeypatch.setattr(slurm, "sacct_rows", rows())
    assert slurm.job_owner(7) is None


def test_a_reused_job_ids_old_run_names_none_of_its_nodes_even_the_same_users(monkeypatch):
    """Issue 51, finding 7: job id 7 reused (a wrap, a reset database) by the same user a year
    later: the old run's nodes are not the new run's to blame. Runs that ended before the reports'
    age bound name none; the runs of this job's requeues within it still do."""
    monkeypatch.setattr(slurm, "live_job_owner", live((64100, "node[2-3]")))
    monkeypatch.setattr(slurm, "sacct_rows", rows(
        "7|64100|node[8-9]|2025-12-04T10:00:00", "7.0||node[8-9]|2025-12-04T10:00:00",
        "7|64100|node[1-2]|2026-12-04T10:00:00", "7|64100|node[2-3]|Unknown"))
    bound = parse_time("2026-12-03T12:00:00")
    assert slurm.job_owner(7, bound) == (64100, "node[2-3],node[1-2],node[2-3]", None)
    assert slurm.job_owner(7) == (64100, "node[2-3],node[8-9],node[8-9],node[1-2],node[2-3]", None)
