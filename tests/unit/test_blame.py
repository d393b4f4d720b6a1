"""Blames of nodes (slurmtools/blame): the report's payload, the root side's decision table, the
admin's settings, and the spool (what the root side reads, and what it refuses to)."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from slurmtools.blame import model, spool
from slurmtools.blame.config import BlameSettings
from slurmtools.blame.model import Accepted, Blame, BlameRules, Verified, decide, kind_of_check, parse_payload
from slurmtools.errors import SpecError

NOW = 1_800_000_000.0


def _blame(**over) -> Blame:
    fields = dict(cluster="mini", job="42", node="node2", check="job.node_failure", evidence="every rank silent",
                  time_s=NOW)
    fields.update(over)
    return Blame(**fields)


def _verified(blame: Blame, uid: int = 1000, job_uid: int = 1000, nodes=("node1", "node2")) -> Verified:
    return Verified(blame, uid, "alice", job_uid, list(nodes))


@pytest.mark.parametrize("check, kind", [
    ("job.node_failure", "node_death"), ("job.gpu_fatal", "xid"), ("job.sdc", "sdc"), ("preflight.canary", "preflight"),
    ("preflight.busbw", "preflight"), ("job.straggler", "straggler"), ("job.hang", "hang"),
    ("job.collective_timeout", "hang"), ("job.crash", None), ("gpu.ecc", None), ("job.hang x", None), ("", None),
])
def test_each_check_is_a_kind_of_evidence_or_none(check, kind):
    assert kind_of_check(check) == kind


def test_a_payload_round_trips_and_its_evidence_is_one_short_line():
    blame = _blame(evidence=model.clean_evidence("rank 3\x1b[2J\non node2 " + "x" * 500))
    parsed, problem = parse_payload(blame.payload())
    assert problem == "" and parsed == blame
    assert "\n" not in parsed.evidence and "\x1b" not in parsed.evidence and len(parsed.evidence) == 160


@pytest.mark.parametrize("payload, problem", [
    ("not json", "payload is not a JSON object"),
    ('{"cluster": "mini"}', "payload lacks job, node, check, evidence"),
    ('{"cluster": "mini", "job": "4 2", "node": "n", "check": "job.hang", "evidence": "", "time_s": 1}',
     "job '4 2' is not a job id"),
    ('{"cluster": "mini", "job": "42", "node": "../etc", "check": "job.hang", "evidence": "", "time_s": 1}',
     "node '../etc' is not a name"),
    ('{"cluster": "mini", "job": "42", "node": "n1", "check": "job.crash", "evidence": "", "time_s": 1}',
     "no kind of evidence for check 'job.crash'"),
    ('{"cluster": "mini", "job": "42", "node": "n1", "check": "job.hang", "evidence": "", "time_s": "now"}',
     "payload lacks time_s"),
    ("{" + '"a": "' + "x" * 5000 + '"}', "payload larger than 4096 bytes"),
])
def test_a_payload_that_is_not_a_blame_is_refused_with_why(payload, problem):
    assert parse_payload(payload) == (None, problem)


def test_the_decision_table():
    rules = BlameRules()
    node_death = _verified(_blame())
    assert decide(node_death, "mini", [], rules, NOW).action == "drain"
    assert decide(node_death, "mini", [], rules, NOW).reason_detail == "every rank silent"
    # whose job, where, which cluster: all from Slurm and munged, never from the report
    assert decide(node_death, "other", [], rules, NOW).why == "job 42 is of cluster 'mini', not 'other'"
    assert decide(_verified(_blame(), job_uid=1001), "mini", [], rules, NOW).why == "job 42 is not a job of uid 1000"
    assert decide(Verified(_blame(), 1000, "alice", None, []), "mini", [], rules, NOW).why == "Slurm knows no job 42"
    assert decide(_verified(_blame(node="node9")), "mini", [], rules, NOW).why == "node node9 was not given to job 42"
    # confirm-first kinds: one job's blame is recorded; a second job's within the window drains
    straggler = _verified(_blame(check="job.straggler"))
    first = decide(straggler, "mini", [], rules, NOW)
    assert (first.action, first.why) == ("record", "straggler needs 2 jobs of as many users within 24 h to drain; "
                                                   "1 so far")
    other_job = [Accepted("41", "node2", "straggler", NOW - 3600)]
    assert decide(straggler, "mini", other_job, rules, NOW).action == "drain"
    stale = [Accepted("41", "node2", "straggler", NOW - 25 * 3600)]
    assert decide(straggler, "mini", stale, rules, NOW).action == "record"
    # a job that blames more nodes than the budget is the suspect
    two = [Accepted("42", "node1", "node_death", NOW - 60), Accepted("42", "node3", "node_death", NOW - 30)]
    refused = decide(node_death, "mini", two, rules, NOW)
    assert refused.action == "refuse" and refused.why.startswith("job 42 blamed 3 nodes within a day (at most 2)")
    assert decide(node_death, "mini", two[:1], rules, NOW).action == "drain"
    assert decide(node_death, "mini", two, BlameRules(max_nodes_per_job_per_day=3), NOW).action == "drain"
    ignoring = BlameRules(actions={**model.DEFAULT_ACTIONS, "node_death": "ignore"})
    assert decide(node_death, "mini", [], ignoring, NOW).action == "record"


def test_budgets_per_user_and_for_the_cluster_and_confirmation_by_other_users():
    """Issue 51, finding 3: every array task or held job had a budget of its own, nothing bounded
    a user or the cluster, two jobs of one user confirmed a straggler, and any report time passed."""
    rules = BlameRules()
    # the user's other jobs (array tasks) blamed four nodes today: a fifth is refused
    mine = [Accepted(str(40 + i), f"node{5 + i}", "node_death", NOW - 60, 1000, True) for i in range(4)]
    refused = decide(_verified(_blame()), "mini", mine, rules, NOW)
    assert (refused.action, refused.why) == ("refuse", "the jobs of uid 1000 blamed 5 nodes within a day (at most "
                                                       "4): the user's jobs are the suspects, not the nodes")
    others = [Accepted(str(40 + i), f"node{5 + i}", "node_death", NOW - 60, 2000 + i, True) for i in range(4)]
    assert decide(_verified(_blame()), "mini", others, rules, NOW).action == "drain"
    # eight drains by anyone within the hour: the ninth waits for a person
    hour = [Accepted(str(40 + i), f"node{10 + i}", "node_death", NOW - 600, 2000 + i, True) for i in range(8)]
    stopped = decide(_verified(_blame()), "mini", hour, rules, NOW)
    assert (stopped.action, stopped.why) == ("refuse", "8 nodes were drained by blames within the hour (at most 8 "
                                                       "for the cluster): a person should look before more go")
    assert decide(_verified(_blame()), "mini", hour[:7], rules, NOW).action == "drain"
    assert decide(_verified(_blame()), "mini", [replace_time(a, NOW - 3700) for a in hour], rules, NOW
                  ).action == "drain"
    # a confirm kind needs another user's job: the same user's second job is not confirmation
    straggler = _verified(_blame(check="job.straggler"))
    same_user = [Accepted("41", "node2", "straggler", NOW - 60, 1000)]
    assert decide(straggler, "mini", same_user, rules, NOW).action == "record"
    other_user = [Accepted("41", "node2", "straggler", NOW - 60, 1001)]
    assert decide(straggler, "mini", other_user, rules, NOW).action == "drain"
    # the report's own time: within report_max_age_h, not in the future
    old = decide(_verified(_blame(time_s=NOW - 25 * 3600)), "mini", [], rules, NOW)
    assert (old.action, old.why) == ("refuse", "the report's time is 25.0 h ago (at most 24 h, none in the future)")
    assert decide(_verified(_blame(time_s=NOW + 3600)), "mini", [], rules, NOW).action == "refuse"
    assert decide(_verified(_blame(time_s=NOW + 60)), "mini", [], rules, NOW).action == "drain"


def test_a_node_a_person_resumed_is_not_drained_again_by_the_reports_that_drained_it():
    """Issue 51, finding 3: two users' hang reports drained node2; a person looked, found nothing and
    resumed it. A third report must not drain it at once on the strength of the two old ones: it
    needs confirmation from here on, as a node never blamed would."""
    rules = BlameRules()
    hang = _verified(_blame(check="job.hang", job="45"))
    drained = [Accepted("43", "node2", "hang", NOW - 7200, 1001),
               Accepted("44", "node2", "hang", NOW - 7100, 1002, True)]
    again = decide(hang, "mini", drained, rules, NOW)
    assert (again.action, again.why) == ("record", "hang needs 2 jobs of as many users within 24 h to drain; "
                                                   "1 so far")
    confirmed = drained + [Accepted("46", "node2", "hang", NOW - 60, 1003)]
    assert decide(hang, "mini", confirmed, rules, NOW).action == "drain"
    # a drain of another node, or an undrained record, changes nothing
    elsewhere = [Accepted("43", "node2", "hang", NOW - 7200, 1001), Accepted("44", "node3", "hang", NOW - 7100,
                                                                            1002, True)]
    assert decide(hang, "mini", elsewhere, rules, NOW).action == "drain"


def test_a_report_written_before_the_nodes_last_drain_by_a_blame_does_not_drain_it_again():
    """Issue 51, finding 3: another rank's report of the same XID (written at the same time as the
    one whose handling drained node2 ten minutes ago) handled after a person looked at node2 and
    resumed it is kept as evidence, not a second drain; a report written since (a new event)
    drains it again. (An accepted record's time is when it was handled.)"""
    rules = BlameRules()
    xid = _verified(_blame(check="job.gpu_fatal", time_s=NOW - 610))
    drained = [Accepted("42", "node2", "xid", NOW - 600, 1000, True)]
    again = decide(xid, "mini", drained, rules, NOW)
    assert (again.action, again.why) == ("record", "node2 was drained by a blame after this report was written "
                                                   "(0.2 h ago): it has served")
    assert decide(_verified(_blame(check="job.gpu_fatal", time_s=NOW - 60)), "mini", drained, rules,
                  NOW).action == "drain"
    # a drain of another node, or a record that drained nothing, changes nothing
    for other in (Accepted("42", "node1", "xid", NOW - 600, 1000, True), Accepted("42", "node2", "xid", NOW - 600,
                                                                                  1000, False)):
        assert decide(xid, "mini", [other], rules, NOW).action == "drain"


def replace_time(accepted: Accepted, time_s: float) -> Accepted:
    from dataclasses import replace
    return replace(accepted, time_s=time_s)


def test_the_admins_settings_are_checked():
    assert BlameSettings(actions={"straggler": "drain"}).rules().actions["straggler"] == "drain"
    assert BlameSettings().rules().actions == model.DEFAULT_ACTIONS
    with pytest.raises(SpecError, match="unknown kind of evidence 'gpu'"):
        BlameSettings(actions={"gpu": "drain"})
    with pytest.raises(SpecError, match="action must be one of drain, confirm, ignore, got 'boom'"):
        BlameSettings(actions={"hang": "boom"})


@pytest.fixture
def spool_dir(tmp_path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("the spool is root's")
    path = tmp_path / "spool"
    spool.make_spool(path)
    return path


def test_a_report_is_claimed_once_and_read_without_following_links_or_waiting_on_fifos(spool_dir, tmp_path):
    assert stat.S_IMODE(os.stat(spool_dir).st_mode) == 0o1733
    good = spool.drop(spool_dir, "MUNGE:abc")
    secret = tmp_path / "secret"
    secret.write_text("root's")
    (spool_dir / "blame.linklinklink.munge").symlink_to(secret)
    os.mkfifo(spool_dir / "blame.fifofifofifo.munge")
    (spool_dir / "blame.bigbigbigbig.munge").write_bytes(b"x" * (spool.MAX_REPORT_BYTES + 1))
    (spool_dir / "other-name").write_text("ignored")
    claimed = {}
    for name, content in spool.claim(spool_dir):
        claimed[name] = content
        spool.forget(spool_dir / "done", name)
    assert claimed == {good.name: b"MUNGE:abc\n", "blame.linklinklink.munge": None,
                       "blame.fifofifofifo.munge": None, "blame.bigbigbigbig.munge": None}
    assert list(spool.claim(spool_dir)) == [] and secret.read_text() == "root's"
    assert sorted(p.name for p in spool_dir.iterdir()) == ["done", "other-name"]


def test_a_spool_that_is_not_root_owned_and_sticky_is_not_read(spool_dir, tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    with pytest.raises(spool.SpoolError, match="is not a root-owned sticky directory"):
        spool.claim(loose)
    link = tmp_path / "link"
    link.symlink_to(spool_dir)
    with pytest.raises(spool.SpoolError, match="is not a root-owned sticky directory"):
        spool.claim(link)
    os.chmod(spool_dir / "done", 0o755)
    with pytest.raises(spool.SpoolError, match="is not root's own directory"):
        spool.claim(spool_dir)


def test_records_are_kept_a_week(spool_dir):
    done = spool.check_spool(spool_dir)
    spool.record(done, "blame.a.munge", {"job": "1", "node": "n1", "kind": "hang", "time_s": NOW, "accepted": True,
                                         "handled_s": NOW - 8 * 24 * 3600})
    spool.record(done, "blame.b.munge", {"job": "2", "node": "n1", "kind": "hang", "time_s": NOW, "accepted": True,
                                         "handled_s": NOW})
    spool.record(done, "blame.c.munge", {"job": "3", "node": "n1", "kind": "hang", "time_s": NOW, "handled_s": NOW})
    assert model.accepted_from(spool.records(done, NOW)) == [Accepted("2", "n1", "hang", NOW)]
    assert sorted(p.name for p in done.iterdir()) == ["blame.b.munge.json", "blame.c.munge.json"]


def test_one_health_run_at_a_time_handles_reports_and_a_second_does_not_wait_long(spool_dir):
    import time
    done = spool.check_spool(spool_dir)
    with spool.handling_lock(done) as first:
        start = time.monotonic()
        with spool.handling_lock(done, wait_s=0.3) as second:
            assert first and not second and 0.3 <= time.monotonic() - start < 2
    with spool.handling_lock(done) as again:
        assert again


def test_the_supervisor_reports_rather_than_drains_and_says_so_when_it_cannot(tmp_path, monkeypatch, capsys):
    import json

    from slurmtools.requeue import actions, policy
    monkeypatch.setenv("SLURMTOOLS_HEALTH_CONFIG", str(tmp_path / "none.yaml"))    # no site config here
    monkeypatch.setattr(actions.drain, "drain", lambda *a: pytest.fail("a job must not drain by default"))
    diag = policy.Diagnosis(policy.Cause.SDC, node="node2", detail="rank 3 disagrees")
    actions.drain_node(42, "42.0", "node2", diag)
    event = json.loads(capsys.readouterr().out)
    assert (event["slurmtools"], event["node"]) == ("blame_failed", "node2")
    assert "blame" in event["error"]


def test_a_directory_named_like_a_report_costs_no_other_report(spool_dir):
    """Finding 5 of issue 51: `blame.zzzz….munge` as a directory sorted last; removing it raised
    after every report before it had been claimed, read and removed, and they were lost unrecorded."""
    early = spool.drop(spool_dir, "MUNGE:early")
    (spool_dir / "blame.zzzzzzzzzzzzzzzz.munge").mkdir()
    (spool_dir / "blame.zzzzzzzzzzzzzzzz.munge" / "inside").write_text("x")
    seen = {}
    for name, content in spool.claim(spool_dir):
        seen[name] = content
        spool.forget(spool_dir / "done", name)              # recorded: removed, the directory too
    assert seen == {early.name: b"MUNGE:early\n", "blame.zzzzzzzzzzzzzzzz.munge": None}
    assert list((spool_dir / "done").iterdir()) == []


def test_a_run_killed_while_handling_loses_no_report(spool_dir):
    """Each report is removed only once the caller recorded it (forget): a run killed in between
    leaves it claimed in done/, and the next run hands it over first."""
    first = spool.drop(spool_dir, "MUNGE:first")
    second = spool.drop(spool_dir, "MUNGE:second")
    reports = spool.claim(spool_dir)
    name, content = next(reports)                  # handling the first one when the run is killed
    reports.close()
    assert (name, content) == (min(first.name, second.name), b"MUNGE:" + (b"first" if first.name < second.name
                                                                         else b"second") + b"\n")
    again = []
    for claimed, _ in spool.claim(spool_dir):
        again.append(claimed)
        spool.forget(spool_dir / "done", claimed)
    assert again == [name, max(first.name, second.name)]
    assert list(spool.claim(spool_dir)) == []


def test_a_record_nested_past_the_parsers_depth_is_skipped_not_the_end_of_all_blame_handling(spool_dir):
    done = spool.check_spool(spool_dir)
    (done / "blame.deepdeepdeep.munge.json").write_text("[" * 30000 + "]" * 30000)   # under the size cap
    spool.record(done, "blame.b.munge", {"job": "2", "node": "n1", "kind": "hang", "time_s": NOW, "accepted": True,
                                         "handled_s": NOW})
    assert [entry["job"] for entry in spool.records(done, NOW)] == ["2"]
    assert not (done / "blame.deepdeepdeep.munge.json").exists()       # no record: removed, not read every run


def test_one_users_flood_of_reports_does_not_hold_back_anothers(spool_dir):
    """Issue 51, finding 6: 64 reports a run, oldest name first: anyone could queue 64 garbage files
    ahead of everybody else's every run. Now each user's reports are taken in turn."""
    for index in range(spool.MAX_REPORTS_PER_RUN + 10):
        path = spool_dir / f"blame.a{index:015d}.munge"
        path.write_text("MUNGE:flood")
        os.chown(path, 1000, 1000)
    late = spool_dir / "blame.zzzzzzzzzzzzzzzz.munge"
    late.write_text("MUNGE:real")
    os.chown(late, 2000, 2000)
    names = spool.waiting(spool_dir)
    assert len(names) == spool.MAX_REPORTS_PER_RUN and names[:2] == ["blame.a000000000000000.munge", late.name]


def test_done_keeps_at_most_its_bound_of_records_the_oldest_going_first(spool_dir, monkeypatch):
    monkeypatch.setattr(spool, "MAX_RECORDS", 3)
    done = spool.check_spool(spool_dir)
    for index in range(5):
        spool.record(done, f"blame.r{index}.munge", {"job": str(index), "node": "n1", "kind": "hang", "time_s": NOW,
                                                    "handled_s": NOW})
        os.utime(done / f"blame.r{index}.munge.json", (NOW + index, NOW + index))
    assert [entry["job"] for entry in spool.records(done, NOW)] == ["2", "3", "4"]
    assert sorted(p.name for p in done.glob("blame.*.json")) == [f"blame.r{i}.munge.json" for i in (2, 3, 4)]


def test_refused_reports_records_go_before_the_evidence_that_counts(spool_dir, monkeypatch):
    """A flood of garbage reports, each refused and recorded, pushed the oldest records out of done/
    whatever they were: an accepted one (a budget's, a confirmation's evidence) went too. Now the
    refused ones go first, the oldest of them."""
    monkeypatch.setattr(spool, "MAX_RECORDS", 3)
    done = spool.check_spool(spool_dir)
    for index, accepted in enumerate([True, False, True, False, False]):
        spool.record(done, f"blame.r{index}.munge", {"job": str(index), "node": "n1", "kind": "hang", "time_s": NOW,
                                                    "handled_s": NOW, "accepted": accepted})
        os.utime(done / f"blame.r{index}.munge.json", (NOW + index, NOW + index))
    assert [entry["job"] for entry in spool.records(done, NOW)] == ["0", "2", "4"]
    assert sorted(p.name for p in done.glob("blame.*.json")) == [f"blame.r{i}.munge.json" for i in (0, 2, 4)]


def test_a_users_reports_past_the_quota_are_removed_unread_and_said_in_one_line(spool_dir, monkeypatch):
    """Per-uid quota (issue 51, finding 6): one user's flood no longer grows what every run lists;
    past MAX_WAITING_PER_USER waiting, that user's newest go unread; another user's stay."""
    from slurmtools.blame import intake
    monkeypatch.setattr(spool, "MAX_WAITING_PER_USER", 3)
    flood = []
    for index in range(5):
        path = spool_dir / f"blame.f{index:015d}.munge"
        path.write_text("MUNGE:flood")
        os.chown(path, 1000, 1000)
        os.utime(path, (NOW + index, NOW + index))
        flood.append(path.name)
    other = spool_dir / "blame.zzzzzzzzzzzzzzzz.munge"
    other.write_text("MUNGE:real")
    os.chown(other, 2000, 2000)
    monkeypatch.setattr(intake.slurm, "cluster_name", lambda: "mini")
    handled = intake.handle(BlameSettings(spool_dir=str(spool_dir), munge_socket="/nonexistent/socket"))
    assert handled[0].line() == ("slurmtools: blame quota of uid 1000: refuse (2 reports past the 3 a user may have "
                                 "waiting, removed unread)")
    # the three oldest of the flood and the other user's were handled (refused here: no munged)
    assert sorted(h.name for h in handled[1:]) == sorted(flood[:3] + [other.name])
    assert sorted(p.name for p in (spool_dir / "done").glob("blame.*.json")) == sorted(
        f"{name}.json" for name in flood[:3] + [other.name])


def test_handling_stops_claiming_at_its_deadline_and_the_rest_wait(spool_dir, monkeypatch):
    """A prolog handles others' blames within what is left of its time box (issue 51, finding 6):
    past it no report is claimed; they wait, unclaimed, for the next run."""
    import time
    from slurmtools.blame import intake
    names = sorted(spool.drop(spool_dir, f"MUNGE:{i}").name for i in range(3))
    monkeypatch.setattr(intake.slurm, "cluster_name", lambda: "mini")
    settings = BlameSettings(spool_dir=str(spool_dir), munge_socket="/nonexistent/socket")
    assert intake.handle(settings, until=time.monotonic() - 1) == []
    assert sorted(p.name for p in spool_dir.iterdir() if p.name != "done") == names
    handled = intake.handle(settings)                     # no bound: each refused (no munged here), recorded
    assert [h.name for h in handled] == names and {h.action for h in handled} == {"refuse"}
    assert sorted(p.name for p in (spool_dir / "done").iterdir() if p.name != ".lock") == [
        f"{name}.json" for name in names]



def test_blames_handle_says_what_it_did_as_json_when_asked(monkeypatch, capsys):
    import argparse
    import json
    from types import SimpleNamespace
    from slurmtools.blame import intake
    from slurmtools.health import admin_args, blame_command
    settings = SimpleNamespace(blame=SimpleNamespace(spool_dir="/spool"))
    monkeypatch.setattr(admin_args, "root_node_settings", lambda args, command, why: ("node1", settings))
    done = [intake.Handled("r1.json", "drain", "hang evidence checked", node="node2", job="42"),
            intake.Handled("bad\nname", "refuse", "not a report")]
    monkeypatch.setattr(intake, "handle", lambda blame_settings: done)
    assert blame_command.cmd_handle(argparse.Namespace(json=True, config=None, node=None)) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"name": "r1.json", "action": "drain", "why": "hang evidence checked", "node": "node2", "job": "42"},
        {"name": "bad\nname", "action": "refuse", "why": "not a report", "node": None, "job": None}]
    assert blame_command.cmd_handle(argparse.Namespace(json=False, config=None, node=None)) == 0
    assert capsys.readouterr().out.splitlines()[1] == "slurmtools: blame bad\\nname: refuse (not a report)"
