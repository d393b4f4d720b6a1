"""A program that does not use TrainingControl (a plain torchrun script): exit 0 on every rank is
its completion, a crash is counted within the budget (never a user error merely for lack of
heartbeats), and its progress shows through its own checkpoints or output lines when the spec
says where (issue 30; a new user's 12-step DDP script ended FAILED as "user_error")."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

from slurmtools.common.ledger import Cause
from slurmtools.errors import SpecError
from slurmtools.requeue import progress, supervisor
from slurmtools.requeue.policy import Evidence, classify
from slurmtools.spec import RequeueSpec
from slurmtools.train.control import TrainingControl


# ---- the policy ------------------------------------------------------------------------------
def test_exit_0_of_a_program_that_reports_nothing_is_its_completion():
    diag = classify(Evidence(exit_code=0, progressed=False, reports_progress=False))
    assert (diag.cause, diag.detail) == (
        Cause.COMPLETED, "exit 0 on every rank (the program reports no progress; its exit is its completion)")
    # a node lost after the program's end is no reason to run it again
    late = classify(Evidence(exit_code=0, progressed=False, reports_progress=False, node_states={"node2": "down"}))
    assert late.cause is Cause.COMPLETED


def test_exit_0_of_a_reporting_program_without_its_marker_is_still_a_user_error():
    diag = classify(Evidence(exit_code=0, progressed=True))
    assert (diag.cause, diag.detail) == (Cause.USER_ERROR, "exited 0 before training completed")


def test_exit_0_after_the_warning_is_a_preemption_for_both():
    for reports in (True, False):
        diag = classify(Evidence(exit_code=0, warning_received=True, progressed=False, reports_progress=reports))
        assert diag.cause is Cause.PREEMPTED


def test_a_crash_of_a_program_that_reports_nothing_counts_as_a_crash():
    tail = "Traceback (most recent call last):\nRuntimeError: CUDA error: an illegal memory access\n"
    diag = classify(Evidence(exit_code=1, progressed=False, reports_progress=False, log_tail=tail))
    assert (diag.cause, diag.detail) == (Cause.CRASH, "exit 1 before the first step")
    # the same crash of a reporting program that never trained: its program or environment is broken
    assert classify(Evidence(exit_code=1, progressed=False, log_tail=tail)).cause is Cause.USER_ERROR


def test_a_user_error_pattern_is_a_user_error_for_both():
    tail = "ModuleNotFoundError: No module named 'mytrainer'\n"
    diag = classify(Evidence(exit_code=1, progressed=False, reports_progress=False, log_tail=tail))
    assert (diag.cause, diag.detail) == (Cause.USER_ERROR, "ModuleNotFoundError")


# ---- the program's own checkpoints and lines ---------------------------------------------------
def test_the_step_is_the_last_number_in_the_name():
    assert [progress.step_in_name(name) for name in ("ckpt-step00120.pt", "/r/run3/step_40/", "epoch=2-step=17.ckpt",
                                                     "latest.pt")] == [120, 40, 17, None]


def test_a_checkpoint_counts_only_when_complete_by_the_programs_convention(tmp_path: Path):
    (tmp_path / "step_4.pt").write_bytes(b"x")
    (tmp_path / "step_8.pt.tmp").write_bytes(b"half")          # being written: the glob does not match it
    assert progress.complete_checkpoints(str(tmp_path / "step_*.pt"), None) == {str(tmp_path / "step_4.pt"): 4}
    (tmp_path / "dcp_10").mkdir()
    (tmp_path / "dcp_20").mkdir()
    (tmp_path / "dcp_10" / ".metadata").write_bytes(b"")
    (tmp_path / "dcp_20" / "__0_0.distcp").write_bytes(b"shard")  # no .metadata yet: cut off or still writing
    assert progress.complete_checkpoints(str(tmp_path / "dcp_*"), ".metadata") == {str(tmp_path / "dcp_10"): 10}


def test_progress_is_a_new_complete_checkpoint_or_a_progress_line(tmp_path: Path):
    (tmp_path / "step_4.pt").write_bytes(b"x")
    watch = progress.ProgressWatch.start("step_*.pt", None, r"step (\d+)/\d+ loss", cwd=tmp_path)
    assert not watch.progressed() and watch.newest_checkpoint_step() == 4 and watch.last_step() is None
    assert watch.log is not None
    watch.log.feed("epoch 0 starting\n")
    assert not watch.progressed()
    watch.log.feed("step 5/12 loss 2.31\n")
    assert watch.progressed() and watch.last_step() == 5
    (tmp_path / "step_8.pt").write_bytes(b"x")
    assert watch.new_checkpoints() == {str(tmp_path / "step_8.pt"): 8} and watch.last_step() == 8


def test_a_hang_is_judged_by_progress_lines_only_when_the_spec_names_them(tmp_path: Path):
    silent = progress.ProgressWatch.start(None, None, None)
    assert silent.stall(False, 0.0, 10_000.0, 60, 120.0) is None           # silence is all it ever shows
    lines = progress.ProgressWatch.start(None, None, r"^step (\d+)")
    assert lines.stall(False, 0.0, 180.0, 60, 120.0) is None              # the first line: allowance + timeout
    stall = lines.stall(False, 0.0, 181.0, 60, 120.0)
    assert stall is not None and stall.detail == "no progress line from the program for 61 s"
    assert lines.log is not None
    lines.log.feed("step 3\n")
    assert lines.stall(False, 0.0, lines.log.last_t + 59, 60, 120.0) is None   # type: ignore[operator]
    later = lines.stall(False, 0.0, lines.log.last_t + 61, 60, 120.0)          # type: ignore[operator]
    assert later is not None and later.step == 3
    # a program that reports progress but never beat: the start-up allowance, then a hang
    assert silent.stall(True, 0.0, 180.0, 60, 120.0) is None
    assert silent.stall(True, 0.0, 181.0, 60, 120.0) is not None


def test_training_control_marks_the_control_dir_before_the_first_step(tmp_path: Path):
    assert not progress.reports_progress(tmp_path, False)
    TrainingControl(control_dir=tmp_path, rank=0)
    assert progress.reports_progress(tmp_path, False)


@pytest.mark.parametrize("settings,words", [
    ({"progress_log_pattern": "step (\\d+"}, "progress_log_pattern: is not a regular expression"),
    ({"progress_checkpoints": "c/*", "progress_checkpoint_marker": "a/b"},
     "progress_checkpoint_marker: must be a file name inside the checkpoint directory, got 'a/b'"),
    ({"progress_checkpoint_marker": ".metadata"}, "progress_checkpoint_marker: needs progress_checkpoints"),
])
def test_bad_progress_settings_are_one_clear_error(settings: Dict[str, Any], words: str):
    with pytest.raises(SpecError) as caught:
        RequeueSpec(**settings)
    assert words in str(caught.value)


# ---- the supervisor around a plain program (no Slurm: a requeue becomes a stop) --------------
PLAIN = """
import os, sys, time
ckpt, crash = sys.argv[1], sys.argv[2] == "crash"
for step in range(1, 5):
    print(f"step {step}/4 loss {1.0 / step:.3f}", flush=True)
    if step % 2 == 0:
        with open(os.path.join(ckpt, f"step_{step}.pt.tmp"), "w") as handle:
            handle.write(str(step))
        os.replace(os.path.join(ckpt, f"step_{step}.pt.tmp"), os.path.join(ckpt, f"step_{step}.pt"))
    if crash and step == 3:
        sys.exit(7)
print("done", flush=True)
"""


def _run(tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str, **requeue: Any) -> "tuple[int, List[dict]]":
    (tmp_path / "ckpt").mkdir(exist_ok=True)
    config = supervisor.SupervisorConfig(requeue=RequeueSpec(**{"hang_timeout_s": 0, **requeue}),
                                         control_dir=tmp_path / "control", poll_s=0.1)
    environ = {key: value for key, value in os.environ.items() if not key.startswith(("SLURM", "SLURMTOOLS"))}
    code = supervisor.run(config, [sys.executable, "-c", PLAIN, str(tmp_path / "ckpt"), mode], environ)
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    return code, [event for event in events if event.get("slurmtools") == "decision"]


def test_a_plain_program_that_exits_0_completes(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    code, decisions = _run(tmp_path, capsys, "ok")
    assert code == 0 and [(d["cause"], d["action"]) for d in decisions] == [("completed", "complete")]


def test_a_plain_programs_crash_is_judged_by_its_own_checkpoints_and_lines(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]):
    code, decisions = _run(tmp_path, capsys, "crash", progress_checkpoints=str(tmp_path / "ckpt" / "step_*.pt"),
                           progress_log_pattern=r"^step (\d+)/")
    assert code == 1 and len(decisions) == 1
    decision = decisions[0]
    assert (decision["cause"], decision["checkpoint_step"], decision["last_step"]) == ("crash", 2, 3)
    assert decision["reason"].endswith("; not under Slurm, cannot requeue")
