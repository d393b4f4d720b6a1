"""Root decides drains on what Slurm says about a job, so it reads only fields no user writes
(issue 51): a job name or comment saying `NodeList=...` names no node; a hostlist is counted
before anyone expands it; one job has one spelling, whatever zeros a report puts in front."""
import pytest

from slurmtools.blame import intake, model
from slurmtools.slurm import commands as slurm
from slurmtools.slurm.parse import hostlist_size

# `scontrol -o show job` of a held job whose user wrote NodeList= into its name and its comment
HOSTILE_SHOW_JOB = ("JobId=17 JobName=x NodeList=gpu[001-512] UserId=alice(1000) GroupId=alice(1000) "
                    "JobState=PENDING Reason=JobHeldUser NodeList=(null) Comment=y NodeList=gpu[001-512]")


def fake_slurm(monkeypatch, answers):
    """Each Slurm command's text, as the installed release prints it (the parsers are the point)."""
    asked = []

    def run(argv, **kwargs):
        asked.append(argv[0])
        return answers[argv[0]]
    monkeypatch.setattr(slurm, "run_slurm", run)
    return asked


def test_a_held_jobs_hostile_name_and_comment_give_it_no_node(monkeypatch):
    from slurmtools.slurm.parse import parse_scontrol_record
    assert parse_scontrol_record(HOSTILE_SHOW_JOB)["NodeList"] == "gpu[001-512]"    # the text parse is fooled
    asked = fake_slurm(monkeypatch, {"sacct": "17|1000|None assigned|Unknown\n", "squeue": "1000|\n",
                                     "scontrol": HOSTILE_SHOW_JOB})
    assert slurm.job_owner(17) == (1000, "", None)
    assert "scontrol" not in asked
    assert intake._expand("") == []


def test_a_running_job_s_nodes_come_from_squeue_and_its_runs_in_accounting(monkeypatch):
    fake_slurm(monkeypatch, {"squeue": "1000|node[3-4]\n",
                             "sacct": "17|1000|node[1-2]|2026-12-04T10:00:00\n17.batch||node1|2026-12-04T10:00:00\n"
                                      "17.0||node[1-2]|2026-12-04T10:00:00\n17|1000|node[3-4]|Unknown\n"})
    assert slurm.job_owner(17) == (1000, "node[3-4],node[1-2],node1,node[1-2],node[3-4]", None)


def test_a_reused_job_ids_runs_by_another_user_name_none_of_their_nodes(monkeypatch):
    fake_slurm(monkeypatch, {"squeue": "1000|node5\n",
                             "sacct": "17|2000|node[1-2]|2020-01-01T00:00:00\n17.0||node[1-2]|2020-01-01T00:00:00\n"
                                      "17|1000|node5|Unknown\n17.0||node5|Unknown\n"})
    assert slurm.job_owner(17) == (1000, "node5,node5,node5", None)


def test_a_job_slurmctld_forgot_is_known_by_when_its_last_run_ended(monkeypatch):
    from slurmtools.slurm.parse import parse_time

    def gone(argv, **kwargs):
        if argv[0] == "squeue":
            raise slurm.SlurmCommandError(argv, 1, "slurm_load_jobs error: Invalid job id specified")
        return "17|1000|node1|2026-12-01T10:00:00\n17.0||node1|2026-12-01T10:00:00\n17|1000|node2|2026-12-02T10:00:00\n"
    monkeypatch.setattr(slurm, "run_slurm", gone)
    assert slurm.job_owner(17) == (1000, "node1,node1,node2", parse_time("2026-12-02T10:00:00"))
    ended = model.Verified(model.Blame("c", "17", "node2", "job.node_failure", "x", 1000.0), 1000, "alice", 1000,
                           ["node1", "node2"], job_ended_s=1000.0 - 25 * 3600)
    old = model.decide(ended, "c", [], model.BlameRules(), 1000.0)
    assert (old.action, old.why) == ("refuse", "job 17 ended 25.0 h ago (at most 24 h)")


def test_an_array_whose_tasks_disagree_on_the_owner_or_an_unreadable_line_is_not_known_live(monkeypatch):
    fake_slurm(monkeypatch, {"squeue": "1000|node1\n2000|node2\n", "sacct": ""})
    assert slurm.live_job_owner(17) is None
    fake_slurm(monkeypatch, {"squeue": "alice|node1\n", "sacct": ""})
    assert slurm.live_job_owner(17) is None


@pytest.mark.parametrize("hostlist, size", [
    ("node1", 1), ("node[1-4]", 4), ("node[1-4,7],gpu01", 6), ("n[0-99999999]", 10 ** 8),
    ("rack[1-2]-n[01-10]", 20), ("", 0), ("node[4-1]", None), ("node[a-b]", None)])
def test_a_hostlist_is_counted_without_expanding_it(hostlist, size):
    assert hostlist_size(hostlist) == size


def test_root_expands_no_hostlist_longer_than_the_bound():
    assert intake._expand("n[0-99999999]") == []
    assert intake._expand("node[1-3]") == ["node1", "node2", "node3"]
    assert intake._expand(f"n[1-{intake.MAX_JOB_NODES + 1}]") == []


def test_one_job_has_one_spelling_so_one_budget():
    blames = [model.parse_payload(model.Blame("c", job, node, "job.node_failure", "x", 1.0).payload())[0]
              for job, node in (("17", "node1"), ("017", "node2"), ("0017", "node3"))]
    assert [b.job for b in blames] == ["17", "17", "17"]
    earlier = [model.Accepted("17", "node1", "node_death", 0.0), *model.accepted_from(
        [{"job": "017", "node": "node2", "kind": "node_death", "time_s": 0.0, "accepted": True}])]
    found = model.Verified(blames[2], 1000, "alice", 1000, ["node1", "node2", "node3"])
    decision = model.decide(found, "c", earlier, model.BlameRules(), 10.0)
    assert decision.action == "refuse" and decision.why.startswith("job 17 blamed 3 nodes within a day (at most 2)")
