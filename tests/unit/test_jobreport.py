"""The job report: the step log (write, buffer, read back), the report's arithmetic, its text form,
the self-contained HTML page, and `slurmtools report`'s errors."""
from __future__ import annotations

import json

import pytest

from slurmtools.common import ledger
from slurmtools.report import text as jobreport
from slurmtools.requeue import goodput
from slurmtools.train import steplog
from slurmtools.train.steplog import CheckpointRecord, StepHistory, StepLog, StepRecord
from tests.unit.test_cli import cli, one_line_error

T0 = 1_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_step_log_buffers_lines_and_reads_back_what_was_written(tmp_path):
    clock = Clock()
    log = StepLog(tmp_path, "9.0", 3, "node2", flush_interval_s=5, clock=clock)
    log.step(1, 0.5, loss=2.0, tokens=64, collective_s=0.1, grad_norm=None)
    assert not log.path.exists()                         # buffered: no file system call per step
    clock.now = 5.0
    log.step(2, 0.25, loss=1.5, tokens=64)
    assert log.path.name == "9.0.rank3.jsonl" and len(log.path.read_text().splitlines()) == 2
    log.checkpoint(2, 0.75, requested=True)              # checkpoints are written at once
    with open(log.path, "a") as handle:                  # a torn line and a foreign one are skipped
        handle.write('{"kind": "step", "rank": "x"}\n{"kind": "step", "step": 3, "loss": NaN\n')
    history = steplog.read(tmp_path)
    assert [(s.attempt_id, s.rank, s.host, s.step, s.step_s, s.loss, s.tokens, s.collective_s)
            for s in history.steps] == [("9.0", 3, "node2", 1, 0.5, 2.0, 64, 0.1),
                                        ("9.0", 3, "node2", 2, 0.25, 1.5, 64, None)]
    assert [(c.step, c.save_s, c.requested) for c in history.checkpoints] == [(2, 0.75, True)]


def test_training_control_keeps_a_step_log_in_the_control_dir(tmp_path, monkeypatch):
    from slurmtools.train.control import TrainingControl
    monkeypatch.delenv("SLURMTOOLS_METRICS_DIR", raising=False)
    monkeypatch.setenv("SLURMTOOLS_ATTEMPT_ID", "12.1")
    control = TrainingControl(tmp_path, rank=0)
    assert control.records_steps and not control.metrics_on
    control.step_done(5, 0.5, tokens=8, loss=1.0)
    control.checkpoint_done(5, 0.2)
    control.mark_complete(5)
    history = steplog.read(tmp_path)
    assert [(s.attempt_id, s.step, s.loss) for s in history.steps] == [("12.1", 5, 1.0)]
    assert [(c.attempt_id, c.step) for c in history.checkpoints] == [("12.1", 5)]
    monkeypatch.delenv("SLURMTOOLS_CONTROL_DIR", raising=False)
    assert not TrainingControl(rank=0).records_steps            # outside a job: nobody reads them


def _chain():
    """A crash at step 6 on n2 (checkpoint at 4), restarted in place, completed at step 20; 1 s a step."""
    events = [ledger.AttemptStart("9.0", T0, nodes="n[1-2]"),
              ledger.AttemptEnd("9.0", T0 + 9, "crash", counted=True, action="restart", node="n2", last_step=6,
                                first_step_t=T0 + 4, checkpoint_step=4),
              ledger.AttemptStart("9.0.1", T0 + 12, restart=1, resume_step=4),
              ledger.AttemptEnd("9.0.1", T0 + 30, "completed", action="complete", last_step=20,
                                first_step_t=T0 + 15, checkpoint_step=20)]
    steps = []
    for attempt, first, last, t in (("9.0", 1, 6, T0 + 3), ("9.0.1", 5, 20, T0 + 14)):
        for step in range(first, last + 1):
            for rank, host in enumerate(("n1", "n1", "n2", "n2")):
                slow = 2.0 if (attempt, host) == ("9.0", "n2") else 1.0
                steps.append(StepRecord(attempt, rank, host, step, t + (step - first), slow, loss=10.0 / step,
                                        tokens=100))
    checkpoints = [CheckpointRecord("9.0", 4, T0 + 6, 0.25), CheckpointRecord("9.0.1", 20, T0 + 29.5, 0.75)]
    return events, StepHistory(steps, checkpoints)


def chain_control_dir(tmp_path):
    """_chain's ledger and rank 0's step log in a control dir under tmp_path."""
    events, history = _chain()
    control = tmp_path / ".slurmtools" / "9"
    for event in events:
        ledger.append(control, event)
    (control / "steps").mkdir()
    (control / "steps" / "9.0.rank0.jsonl").write_text("".join(
        json.dumps(dict(kind="step", **s.__dict__)) + "\n" for s in history.steps if s.rank == 0))
    return control


def test_the_report_holds_the_series_the_marks_and_a_breakdown_that_adds_up():
    events, history = _chain()
    report = jobreport.build("9", events, history)
    assert report.loss["9.0"][0] == (1, 10.0) and [s for s, _ in report.loss["9.0.1"]] == list(range(5, 21))
    assert report.tokens_per_s["9.0"][0] == (1, 100 / 1 * 2 + 100 / 2 * 2)       # the job's rate: all ranks
    # n2 was slow in the first attempt only; the restart's steps 5 and 6 replace the first run's
    assert dict(report.step_s_by_node["n2"])[3] == 2.0 and dict(report.step_s_by_node["n2"])[5] == 1.0
    assert [(m.kind, m.label) for m in report.marks] == [
        ("checkpoint", "checkpoint step 4 (0.2 s)"), ("failure", "crash on n2 -> restart"),
        ("checkpoint", "checkpoint step 20 (0.8 s)")]
    b = report.breakdown      # 20 steps of 1 s, 1 s saving, 3 s to restart + 3 s to its first step, 2 steps lost
    assert (b.wall_s, b.training_s, b.checkpointing_s, b.restarts_s, b.lost_s) == (30.0, 20.0, 1.0, 6.0, 2.0)
    assert b.waiting_s == pytest.approx(1.0) and report.goodput.ratio == pytest.approx(20 / 30)


def test_estimates_past_the_wall_time_shrink_the_overheads_not_the_training():
    events, history = _chain()
    costly = StepHistory(history.steps, [CheckpointRecord("9.0", 4, T0 + 6, 500.0)])
    b = jobreport.build("9", events, costly).breakdown
    assert sum(value for _, value in b.parts()) == pytest.approx(b.wall_s) and b.waiting_s == 0.0
    assert b.training_s == pytest.approx(jobreport.build("9", events, history).breakdown.training_s)


def test_the_text_form_lists_attempts_breakdown_and_events():
    events, history = _chain()
    text = jobreport.format_text(jobreport.build("9", events, history))
    assert "  9.0            +0.0 s .. +9.0 s     steps 0..6  crash on n2 -> restart" in text.splitlines()
    assert "  9.0.1          +12.0 s .. +30.0 s    steps 4..20  completed -> complete" in text.splitlines()
    assert "median step time by node: n1 1.000 s (slowest rank 0), n2 1.000 s (slowest rank 2)" in text
    assert "  +9.0 s  crash on n2 -> restart" in text.splitlines()


def test_the_html_page_is_self_contained_with_every_plot():
    pytest.importorskip("matplotlib")
    from slurmtools.report import html as report_html
    events, history = _chain()
    page = report_html.render(jobreport.build("9<b>", events, history))
    assert report_html.plot_ids(page) == list(report_html.PLOTS)
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org", "")
    assert "https://" not in page and "<b>" not in page.split("<body>")[1].split("<figure")[0]
    assert page.count("<svg") == len(report_html.PLOTS)


def test_report_command_text_html_and_one_line_errors(tmp_path):
    pytest.importorskip("matplotlib")
    control = chain_control_dir(tmp_path)
    proc = cli("report", str(control))
    assert proc.returncode == 0 and proc.stdout.startswith("job 9\nattempts: 2 (failures 1, preemptions 0)\n")
    out = tmp_path / "r.html"
    proc = cli("report", str(control), "--html", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"wrote {out} (timeline, progress, step-time, breakdown)\n"
    assert out.read_text().startswith("<!DOCTYPE html>") and not list(tmp_path.glob(".r.html.*"))
    as_json = cli("report", str(control), "--json")
    got = json.loads(as_json.stdout)
    assert as_json.returncode == 0 and got["job"] == "9" and len(got["attempts"]) == 2
    assert set(got["breakdown"]) >= {"wall_s", "training_s", "restarts_s"} and 0 < got["goodput"]["ratio"] <= 1
    one_line_error(cli("report", str(control), "--json", "--html", "x.html"), 2, "not allowed with argument")
    one_line_error(cli("report", str(tmp_path / "none")), 2, "no ledger records at")
    one_line_error(cli("report", "123"), 2, "give the job's spec (--spec JOB.yaml)")
    one_line_error(cli("report", str(control), "--html", str(tmp_path / "no" / "dir" / "r.html")), 2,
                   "cannot write the page")
    (tmp_path / "pages").mkdir()
    one_line_error(cli("report", str(control), "--html", str(tmp_path / "pages")), 2, "is a directory")
    assert list(tmp_path.glob(".pages*")) == [] and list((tmp_path / "pages").iterdir()) == []


def test_a_refused_checkpoint_is_kept_in_the_ledger_and_marked_in_the_report(tmp_path):
    """The trainer's rank 0 records each newer checkpoint its resume passed over; the attempt
    arithmetic is unchanged and the report marks it with why."""
    from slurmtools.train.control import TrainingControl
    events, history = _chain()
    control_dir = tmp_path / "control"
    for event in events[:3]:
        ledger.append(control_dir, event)
    refused = [(str(tmp_path / "ckpt" / "step_8"), "checksum mismatch in __1_0.distcp")]
    TrainingControl(control_dir, rank=1).checkpoints_refused(refused)       # only rank 0 writes
    TrainingControl(control_dir, rank=0).checkpoints_refused(refused)
    ledger.append(control_dir, events[3])
    read = ledger.read(control_dir)
    kept = [e for e in read if isinstance(e, ledger.CheckpointRefused)]
    assert [(e.path, e.why) for e in kept] == refused and read[3] is not None and len(read) == 5
    assert ledger.attempts(read) == ledger.attempts(events)
    assert goodput.goodput(read) == goodput.goodput(events)
    labels = [m.label for m in jobreport.build("9", read, history).marks if m.kind == "refused"]
    assert labels == ["checkpoint step_8 refused: checksum mismatch in __1_0.distcp"]
