"""`submit --wait`: one status line redrawn in place on a terminal, a line per change elsewhere."""
from __future__ import annotations

import io
import json

from slurmtools.job import submit as jobs
from slurmtools.slurm import commands as slurm
from slurmtools.slurm.parse import JobInfo


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(monkeypatch, tmp_path, out):
    log = tmp_path / "job.out"
    states = iter([("PENDING", "Priority", 0, None), ("RUNNING", "None", 0, 3), ("RUNNING", "None", 0, 5),
                   ("COMPLETED", "None", 0, None)])

    def job_state(job_id):
        state, reason, restarts, step = next(states)
        if step is not None:
            with log.open("a") as fh:
                fh.write(json.dumps({"step": step, "total_steps": 5, "loss": 1.5, "attempt_id": "7.0"}) + "\n")
        return JobInfo(job_id, state, reason, "node[1-2]" if state != "PENDING" else "", stdout=str(log))
    monkeypatch.setattr(slurm, "job_state", job_state)
    monkeypatch.setattr(jobs.time, "sleep", lambda s: None)
    return jobs.wait_for_job(7, out=out)


def test_a_pipe_gets_one_line_per_change(monkeypatch, tmp_path):
    out = io.StringIO()
    assert _run(monkeypatch, tmp_path, out).state == "COMPLETED"
    assert out.getvalue().splitlines() == [
        "job 7: PENDING (Priority)", "job 7: RUNNING on node[1-2]", "job 7: step 3/5 loss 1.5000 (attempt 7.0)",
        "job 7: step 5/5 loss 1.5000 (attempt 7.0)", "job 7: COMPLETED on node[1-2]"]


def test_a_terminal_gets_one_line_redrawn_in_place(monkeypatch, tmp_path):
    out = Terminal()
    _run(monkeypatch, tmp_path, out)
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    frames = text.rstrip("\n").split("\r\033[K")[1:]
    assert frames == ["job 7: PENDING (Priority)", "job 7: RUNNING on node[1-2]",
                      "job 7: RUNNING on node[1-2] | step 3/5 loss 1.5000 (attempt 7.0)",
                      "job 7: RUNNING on node[1-2] | step 5/5 loss 1.5000 (attempt 7.0)",
                      "job 7: COMPLETED on node[1-2] | step 5/5 loss 1.5000 (attempt 7.0)"]


def test_notebook_watch_in_a_terminal_redraws_one_line_until_the_job_is_done(monkeypatch):
    from slurmtools.job import notebook_view
    from slurmtools.job.notebook import JobStatus

    class Job:
        job_id = "9"
        polls = iter([False, False, True, True])

        def done(self) -> bool:
            return next(self.polls)
    shown = iter([JobStatus("9", "PENDING", None, [], None), JobStatus("9", "RUNNING", "step 3/5", [], None),
                  JobStatus("9", "COMPLETING", "step 5/5", [], None),
                  JobStatus("9", "COMPLETED", "step 5/5", [], None, finished=True)])
    monkeypatch.setattr(notebook_view, "status", lambda job, spec, tail_lines: next(shown))
    monkeypatch.setattr(notebook_view.time, "sleep", lambda s: None)
    out = Terminal()
    last = notebook_view.watch(Job(), out=out)
    assert last.state == "COMPLETED" and not notebook_view.in_jupyter()
    assert out.getvalue() == ("\r\033[Kjob 9: PENDING\r\033[Kjob 9: RUNNING - step 3/5"
                              "\r\033[Kjob 9: COMPLETING - step 5/5\r\033[Kjob 9: COMPLETED - step 5/5\n")
