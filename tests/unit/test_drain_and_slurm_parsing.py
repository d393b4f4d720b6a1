"""Drain reasons we own, and parsing of Slurm's command output (recorded from Slurm 22.05.8)."""
import json

import pytest

from slurmtools.slurm import commands as slurm
from slurmtools.slurm.drain import DrainReason, is_ours, parse_reason


def test_reason_renders_and_parses_back():
    r = DrainReason("CRITICAL", "gpu.ecc", "gpu=3 dbe=2", "1234")
    assert r.render() == "slurmtools: CRITICAL gpu.ecc gpu=3 dbe=2 job=1234"
    assert parse_reason(r.render()) == {"status": "CRITICAL", "check": "gpu.ecc", "detail": "gpu=3 dbe=2", "job": "1234"}


def test_reason_is_sanitized_and_bounded():
    r = DrainReason("CRITICAL", "ib.port", "state='DOWN' \"x\" ; rm -rf /\n" + "y" * 500)
    text = r.render()
    assert "'" not in text and '"' not in text and "\n" not in text
    assert len(text) <= 200 and text.endswith("...")


@pytest.mark.parametrize("reason,ours", [("slurmtools: CRITICAL gpu.xid xid=79", True),
                                         ("manual: bad HBM ECC", False), ("Prolog error", False),
                                         ("  slurmtools: WARN x", True), ("healthcheck: slurmtools: x", False)])
def test_only_prefixed_reasons_are_ours(reason, ours):
    assert is_ours(reason) is ours
    assert (parse_reason(reason) is not None) is ours


NODE_LINE = ("NodeName=node2 Arch=x86_64 CoresPerSocket=4 CPUAlloc=0 CPUEfctv=4 CPUTot=4 CPULoad=0.10 "
             "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:4 NodeAddr=10.77.0.12 NodeHostName=node2 "
             "Version=22.05.8 OS=Linux RealMemory=4000 State=IDLE+DRAIN ThreadsPerCore=1 "
             "Partitions=gpu BootTime=None Reason=manual: bad HBM ECC [root@2026-11-29T16:00:57]")


def test_parse_node_record_with_spaces_in_reason():
    info = slurm.parse_node_record(slurm.parse_scontrol_record(NODE_LINE))
    assert info.name == "node2" and info.state == "idle" and info.flags == ("DRAIN",)
    assert info.reason == "manual: bad HBM ECC"
    assert (info.reason_user, info.reason_time) == ("root", "2026-11-29T16:00:57")
    assert info.display_state == "drained" and info.gres == "gpu:4"


def test_display_states():
    mk = lambda state: slurm.parse_node_record({"NodeName": "n", "State": state})  # noqa: E731
    assert mk("MIXED+DRAIN").display_state == "draining"
    assert mk("DOWN+NOT_RESPONDING").display_state == "down*"
    assert mk("IDLE").display_state == "idle"


def test_parse_job_id():
    assert slurm.parse_job_id("123\n") == 123
    assert slurm.parse_job_id("77;cluster") == 77
    with pytest.raises(slurm.SlurmCommandError, match="unexpected output"):
        slurm.parse_job_id("sbatch: error")


def test_sacct_json_takes_newest_record():
    text = json.dumps({"jobs": [
        {"job_id": 9, "state": {"current": "REQUEUED", "reason": "None"}, "nodes": "node[1-2]",
         "exit_code": {"status": "SUCCESS", "return_code": 0}},
        {"job_id": 9, "state": {"current": "COMPLETED", "reason": "None"}, "nodes": "node[1,3]",
         "exit_code": {"status": "SUCCESS", "return_code": 0}}]})
    info = slurm.parse_sacct_json(text, 9)
    assert (info.state, info.nodes, info.exit_code) == ("COMPLETED", "node[1,3]", "0:0")


def test_run_slurm_errors_carry_argv_and_stderr():
    with pytest.raises(slurm.SlurmCommandError) as info:
        slurm.run_slurm(["sh", "-c", "echo boom >&2; exit 3"])
    assert (info.value.returncode, info.value.stderr) == (3, "boom")
    assert str(info.value) == "sh -c echo boom >&2; exit 3 exited 3: boom"
    with pytest.raises(slurm.SlurmCommandError, match="command not found"):
        slurm.run_slurm(["definitely-not-a-slurm-command"])
    with pytest.raises(slurm.SlurmCommandError, match="timed out") as info:
        slurm.run_slurm(["sleep", "5"], timeout_s=0.2)
    assert info.value.timed_out


def test_survive_sigterm_commands_ignore_sigterm():
    """A job requeueing itself is sent SIGTERM, its scontrol children included: those must finish."""
    out = slurm.run_slurm(["sh", "-c", "kill -TERM $$; echo survived"], survive_sigterm=True)
    assert out.strip() == "survived"
    with pytest.raises(slurm.SlurmCommandError) as info:
        slurm.run_slurm(["sh", "-c", "kill -TERM $$; echo survived"])
    assert info.value.returncode == -15


JOB_LINE = ("JobId=42 JobName=tiny UserId=root(0) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 "
            "Restarts=2 BatchFlag=1 ExitCode=0:0 RunTime=00:00:05 NodeList=node[1-2] BatchHost=node1 "
            "StdOut=/runs/tiny-42.out")


def test_parse_job_record_from_one_scontrol_line():
    info = slurm.parse_job_record(slurm.parse_scontrol_record(JOB_LINE), 42)
    assert (info.job_id, info.state, info.reason, info.nodes, info.exit_code, info.restarts) == (
        42, "RUNNING", "None", "node[1-2]", "0:0", 2)
    pending = slurm.parse_job_record({"JobState": "PENDING", "NodeList": "(null)", "Reason": "BeginTime"}, 7)
    assert (pending.state, pending.nodes, pending.finished) == ("PENDING", "", False)
    assert slurm.parse_job_record({"JobState": "CANCELLED+"}, 7).finished


def test_transient_controller_errors_are_retried_then_raised(monkeypatch):
    calls = []

    def flaky(argv, *rest):
        calls.append(argv)
        if len(calls) < 3:
            raise slurm.SlurmCommandError(argv, 1, "squeue: error: Unable to contact slurm controller (connect failure)")
        return "ok"

    monkeypatch.setattr(slurm, "_run_once", flaky)
    monkeypatch.setattr(slurm.time, "sleep", lambda s: None)
    assert slurm.run_slurm(["squeue"]) == "ok" and len(calls) == 3
    calls.clear()

    def broken(argv, *rest):
        calls.append(argv)
        raise slurm.SlurmCommandError(argv, 1, "scontrol: error: Invalid job id specified")

    monkeypatch.setattr(slurm, "_run_once", broken)
    try:
        slurm.run_slurm(["scontrol"])
    except slurm.SlurmCommandError as exc:
        assert "Invalid job id" in str(exc) and len(calls) == 1       # not transient: no retry
    else:
        raise AssertionError("no error")


def test_using_conf_points_one_block_of_commands_at_one_cluster(monkeypatch):
    seen = []
    monkeypatch.setattr(slurm.subprocess, "run", lambda argv, **kw: seen.append(kw["env"]) or
                        slurm.subprocess.CompletedProcess(argv, 0, "x", ""))
    with slurm.using_conf("/var/lib/slurmtools/minicluster/side/etc/slurm.conf"):
        slurm.run_slurm(["sinfo"])
    slurm.run_slurm(["sinfo"])
    assert seen[0]["SLURM_CONF"] == "/var/lib/slurmtools/minicluster/side/etc/slurm.conf"
    assert seen[1] is None                                         # outside: the environment as it is


def test_a_reason_whose_text_looks_like_a_field_reads_back_whole():
    from slurmtools.slurm.drain import DrainReason
    from slurmtools.slurm.parse import parse_scontrol_record
    reason = DrainReason("CRITICAL", "job.sdc", "rank 3 Reason=forged State=IDLE node=n2", "5", "alice").render()
    assert reason == "slurmtools: CRITICAL job.sdc rank 3 Reason:forged State:IDLE node=n2 user=alice job=5"
    line = f"NodeName=node2 Arch=x86_64 State=IDLE+DRAIN Reason={reason} [root@2026-12-01T20:00:00]"
    assert parse_scontrol_record(line)["Reason"] == reason + " [root@2026-12-01T20:00:00]"


def test_a_reason_with_brackets_keeps_them_and_loses_only_scontrols_suffix():
    from slurmtools.slurm.parse import parse_node_record
    node = parse_node_record({"NodeName": "node2", "State": "IDLE+DRAIN",
                              "Reason": "slurmtools: CRITICAL job.sdc rank 3 [31mforged user=u job=5 [root@2026-12-01T20:00]"})
    assert node.reason == "slurmtools: CRITICAL job.sdc rank 3 [31mforged user=u job=5"


def test_the_notes_slurmctld_appends_to_our_reason_are_not_ours():
    """24.11 and 26.05 append " : Not responding" to a drained node's reason when it then stops
    answering (seen on the mini-cluster: a node killed and blamed); 22.05 leaves the reason alone."""
    from slurmtools.slurm.drain import parse_reason, without_slurm_notes
    ours = "slurmtools: CRITICAL job.node_failure node node2: every rank silent user=alice job=7"
    assert without_slurm_notes(ours + " : Not responding") == ours
    assert without_slurm_notes(ours + " : Not responding : Kill task failed") == ours
    assert without_slurm_notes(ours + " : something else") == ours + " : something else"
    assert parse_reason(ours + " : Not responding") == {
        "status": "CRITICAL", "check": "job.node_failure", "user": "alice", "job": "7",
        "detail": "node node2: every rank silent"}


def test_a_slurm_command_error_survives_pickling_whole():
    """A forked child's or worker's failure travels back as itself (tests/cluster/asuser.py)."""
    import pickle
    error = slurm.SlurmCommandError(["scancel", "--batch", "--signal=USR1", "7"], None, "no answer\nmore", timed_out=True)
    back = pickle.loads(pickle.dumps(error))
    assert (type(back), back.argv, back.returncode, back.stderr, back.timed_out, str(back)) == (
        slurm.SlurmCommandError, error.argv, None, "no answer\nmore", True, "scancel --batch --signal=USR1 ... timed out: no answer")
