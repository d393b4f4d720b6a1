"""Hostile and damaged inputs to the surfaces that read what a job's own processes wrote (the
ledger, the step log, flight-recorder dumps) and to the commands around them (report, goodput,
plan, preflight, health record-ib, the prolog's fail-closed path): each gives a one-line error or
a skipped record, never a traceback, a hang, a huge allocation or a write through a link."""
from __future__ import annotations

import os
import pickle
import tracemalloc

import pytest

from slurmtools.common import fsutil
from slurmtools.common import ledger
from slurmtools.report import text as jobreport
from slurmtools.requeue import flightrec, goodput
from slurmtools.train import fr_dump, steplog
from slurmtools.train.steplog import StepHistory, StepRecord
from tests.unit.test_cli import cli, one_line_error
from tests.unit.test_jobreport import T0, _chain, chain_control_dir

DEEP = "[" * 200_000 + "]" * 200_000


# ---- the JSON-lines reader ------------------------------------------------------------------
@pytest.mark.parametrize("line", [
    '{"event": "start", "deep": ' + DEEP + "}",                          # RecursionError in json
    '{"event": "start", "attempt_id": "1.0", "time_s": 1' + "0" * 400 + "}",   # a 401-digit integer
    '{"event": "start", "attempt_id": "1.0", "time_s": NaN}',
    '{"event": "start", "attempt_id": "1.0", "time_s": -Infinity}',
    '{"event": "start", "attempt_id": "1.0", "time_s": 1e400}',
])
def test_a_line_out_of_any_bound_is_skipped(line):
    assert fsutil.json_lines(line + '\n{"event": "ok"}\n') == [{"event": "ok"}]


def test_integers_are_bounded_where_they_are_parsed():
    assert fsutil.json_object('{"a": 9223372036854775807}') == {"a": 2 ** 63 - 1}
    assert fsutil.json_object('{"a": -1234567890123456789}') == {"a": -1234567890123456789}
    assert fsutil.json_object('{"a": 12345678901234567890}') is None


def test_a_ledger_that_is_a_fifo_a_link_to_dev_zero_or_too_large_reads_as_empty(tmp_path, monkeypatch):
    fifo = tmp_path / "fifo" / ledger.LEDGER_FILE
    fifo.parent.mkdir()
    os.mkfifo(fifo)                                  # opening it for reading would wait for a writer
    assert ledger.read(fifo.parent) == []
    zero = tmp_path / "zero" / ledger.LEDGER_FILE
    zero.parent.mkdir()
    zero.symlink_to("/dev/zero")                     # read_text() would fill memory
    assert ledger.read(zero.parent) == []
    big = tmp_path / "big" / ledger.LEDGER_FILE
    big.parent.mkdir()
    ledger.append(big.parent, ledger.AttemptStart("1.0", 5.0))
    assert len(ledger.read(big.parent)) == 1
    monkeypatch.setattr(ledger, "MAX_LEDGER_BYTES", 10)
    assert ledger.read(big.parent) == []


def test_step_log_files_that_are_fifos_or_links_are_skipped(tmp_path):
    control = chain_control_dir(tmp_path)
    os.mkfifo(control / "steps" / "9.1.rank0.jsonl")
    (control / "steps" / "9.2.rank0.jsonl").symlink_to("/dev/zero")
    history = steplog.read(control)
    assert {s.attempt_id for s in history.steps} == {"9.0", "9.0.1"}
    for target in ([str(control)], [str(control), "--json"]):
        proc = cli("goodput", *target)
        assert proc.returncode == 0 and proc.stderr == ""
    assert cli("report", str(control)).returncode == 0


@pytest.mark.parametrize("record", [
    {"loss": 1.7e308}, {"step_s": -1e308}, {"step_s": -0.5}, {"tokens": 10 ** 30}, {"tokens": 1.5},
    {"rank": True}, {"step": -3}, {"time_s": 1e300}, {"collective_s": -1.0},
])
def test_a_step_record_out_of_range_is_skipped(record):
    base = {"kind": "step", "attempt_id": "1.0", "rank": 0, "host": "n1", "step": 3, "time_s": T0, "step_s": 0.5,
            "loss": 2.0, "tokens": 64}
    assert steplog._step({**base}) is not None
    assert steplog._step({**base, **record}) is None


def test_the_trainer_never_dies_of_our_bookkeeping(tmp_path, monkeypatch):
    from slurmtools.train.control import TrainingControl
    monkeypatch.setenv("SLURMTOOLS_ATTEMPT_ID", "12.0")
    monkeypatch.setenv("SLURMTOOLS_METRICS_DIR", str(tmp_path / "metrics"))
    control = TrainingControl(tmp_path, rank=0)
    control.step_done(1, 0.5, tokens=10 ** 400, loss=float("nan"), grad_norm=float("inf"))
    control.step_done(2, -1e308, tokens=8)                    # not a step we can account: skipped
    control.step_done(3, 0.5, tokens=8, loss=1.0)
    import numpy
    control.step_done(numpy.int64(4), numpy.float32(0.5), tokens=numpy.int64(8), loss=numpy.float64(2.0))
    control.mark_complete(4)                                  # flushes the metrics; the step log too
    control._steplog.flush()
    history = steplog.read(tmp_path)
    assert [(s.step, s.tokens, s.loss) for s in history.steps] == [(1, None, None), (3, 8, 1.0), (4, 8, 2.0)]


# ---- the report's text, plots and page -----------------------------------------------------
def _hostile_report(node: str, attempt: str = "9.0") -> jobreport.JobReport:
    events = [ledger.AttemptStart(attempt, T0, nodes=node),
              ledger.AttemptEnd(attempt, T0 + 9, "crash", counted=True, action="restart", node=node, last_step=3,
                                first_step_t=T0 + 2, checkpoint_step=2, last_step_t=T0 + 4),
              ledger.AttemptStart("9.1", T0 + 12, restart=1, resume_step=2),
              ledger.AttemptEnd("9.1", T0 + 20, "completed", action="complete", last_step=5, first_step_t=T0 + 14,
                                checkpoint_step=5, last_step_t=T0 + 19)]
    steps = [StepRecord(attempt, 0, node, step, T0 + 1 + step, 1.0, loss=1.0) for step in range(1, 4)]
    return jobreport.build("9", events, StepHistory(steps, []))


def test_control_characters_in_names_reach_the_terminal_escaped():
    text = jobreport.format_text(_hostile_report("n1\x1b[2J\x07", "9.0\nforged line"))
    assert "\x1b" not in text and "\x07" not in text and "\nforged line" not in text
    assert "n1\\x1b[2J\\x07" in text and "9.0\\nforged line" in text


def test_names_are_drawn_as_plain_text_not_mathtext():
    pytest.importorskip("matplotlib")
    from slurmtools.report import html as report_html
    page = report_html.render(_hostile_report("$\\frac{$"))
    assert report_html.plot_ids(page) == list(report_html.PLOTS)


def test_restart_latency_runs_from_the_last_step_to_the_next_first_step_and_step_time_is_one():
    report = _hostile_report("n1")
    assert report.goodput.restart_latency_s == [10.0]          # last step T0+4 -> first step T0+14
    assert report.goodput.step_time_s == 1.0 and report.goodput.step_time_source == "step log"
    text = jobreport.format_text(report)
    assert "step time (median, slowest rank's step): 1.000 s" in text
    assert "median step time by node: n1 1.000 s (slowest rank 0)" in text
    assert "restart latency (last step -> next first step): 10.0 s" in text
    assert report.breakdown.restarts_s == 10.0
    assert goodput.goodput(_chain()[0]).step_time_source == "heartbeats"


def test_the_page_write_never_follows_a_link_and_leaves_no_temp_file(tmp_path):
    from slurmtools.report import html as report_html
    target = tmp_path / "elsewhere.txt"
    target.write_text("theirs")
    page = tmp_path / "r.html"
    for name in (f".r.html.{os.getpid()}.tmp", ".r.html.tmp"):   # the old fixed temp name, and a guess
        (tmp_path / name).symlink_to(target)
    report_html.write_page(page, "<html>ours</html>")
    assert target.read_text() == "theirs" and not page.is_symlink() and page.read_text() == "<html>ours</html>"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".r.html.tmp", f".r.html.{os.getpid()}.tmp", "elsewhere.txt", "r.html"])


def test_report_html_with_an_empty_name_is_an_error(tmp_path):
    one_line_error(cli("report", str(chain_control_dir(tmp_path)), "--html", ""), 2, "--html: give the page's file name")


@pytest.mark.parametrize("ledger_text", [
    '{"event": "start", "attempt_id": "1.0", "time_s": ' + DEEP + "}\n",
    '{"event": "start", "attempt_id": "1.0", "time_s": 1' + "0" * 400 + "}\n",
])
def test_report_and_goodput_on_a_hostile_ledger_say_so_in_one_line(tmp_path, ledger_text):
    control = tmp_path / "c"
    control.mkdir()
    (control / ledger.LEDGER_FILE).write_text(ledger_text)
    for argv in (["report", str(control)], ["report", str(control), "--html", str(tmp_path / "p.html")],
                 ["goodput", str(control)]):
        one_line_error(cli(*argv), 2, "no ledger records at")


# ---- flight-recorder dumps ------------------------------------------------------------------
def test_a_dump_with_a_huge_memo_index_is_refused_without_allocating_it():
    hostile = b"\x80\x04N" + b"r" + (2 ** 26).to_bytes(4, "little") + b"."      # LONG_BINPUT 2**26
    tracemalloc.start()
    try:
        assert fr_dump.parse_dump(hostile) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000
    plain = {"entries": [{"state": "completed", "collective_seq_id": n} for n in range(50)], "pg_config": {}}
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert fr_dump.parse_dump(pickle.dumps(plain, protocol=protocol)) == plain


def test_a_dump_that_is_a_fifo_is_skipped(tmp_path):
    os.mkfifo(tmp_path / "rank_0")
    (tmp_path / "rank_1").write_bytes(pickle.dumps({"entries": []}))
    assert flightrec.read_reduced(tmp_path) == {1: {}}


# ---- plan, preflight, record-ib, the fail-closed prolog ------------------------------------------
def test_plan_past_its_ranges_is_one_line():
    one_line_error(cli("plan", "--checkpoint-cost-s", "10", "--nodes", "1000000000000", "--node-mtbf-h", "5e-324"),
                   2, "nodes must be between 1 and 1000000")
    one_line_error(cli("plan", "--checkpoint-cost-s", "10", "--nodes", "100", "--node-mtbf-h", "5e-324"),
                   2, "node MTBF must be between 0.01 and 1e+09 hours")


@pytest.mark.parametrize("env, message", [
    ({"SLURM_JOB_ID": "abc", "SLURM_JOB_NODELIST": "node1"}, "SLURM_JOB_ID is not a Slurm job id: 'abc'"),
    ({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-"}, "SLURM_JOB_NODELIST: not a valid hostlist 'node[1-'"),
])
def test_preflight_with_broken_slurm_variables_is_one_line(env, message):
    one_line_error(cli("preflight", env_extra=env), 2, message)


def test_record_ib_skips_a_net_dir_that_points_outside_the_root(tmp_path):
    from slurmtools.health.record_ib import record
    root = tmp_path / "root"
    pci = root / "sys" / "devices" / "pci0000:00" / "0000:17:00.0"
    device = pci / "infiniband" / "mlx5_0"
    (device / "ports" / "1" / "counters").mkdir(parents=True)
    (device / "ports" / "1" / "state").write_text("4: ACTIVE\n")
    (root / "sys" / "class" / "infiniband").mkdir(parents=True)
    (root / "sys" / "class" / "infiniband" / "mlx5_0").symlink_to(device)
    outside = tmp_path / "outside"
    (outside / "ib0").mkdir(parents=True)
    (outside / "ib0" / "operstate").write_text("up\n")
    (pci / "net").symlink_to(outside)
    assert record(root, tmp_path / "out") == ["mlx5_0"]
    assert not (tmp_path / "out" / "sys" / "class" / "net").exists()


def test_no_drain_never_drains_even_when_slurmtools_fails_closed(monkeypatch):
    from slurmtools.health import config, gate

    def broken(*args, **kwargs):
        raise RuntimeError("a bug of ours")

    drained = []
    monkeypatch.setattr(gate, "run_phase", broken)
    monkeypatch.setattr(gate.drains, "drain", lambda host, reason: drained.append((host, reason)))
    settings = config.NodeSettings(on_internal_error="closed")
    off = gate.run_guarded(settings, "prolog", "node1", job_id="7", allow_drain=False)
    assert off is not None and off.status.name == "CRITICAL" and off.drained_reason is None and drained == []
    on = gate.run_guarded(settings, "prolog", "node1", job_id="7", allow_drain=True)
    assert on is not None and [host for host, _ in drained] == ["node1"]
    assert on.drained_reason == "slurmtools: CRITICAL slurmtools.internal RuntimeError: a bug of ours job=7"
