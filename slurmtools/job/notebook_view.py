"""Watching a submitit job and showing its report, in a notebook or a terminal.

In a Jupyter kernel the job's one-line status is one display updated in place (IPython's
display ids), and the report is the self-contained HTML page in an iframe (its styles stay in
it); in a terminal the status is one redrawn line (jobs.StatusLine) and the report is text."""
from __future__ import annotations

import html
import sys
import time
from pathlib import Path
from typing import Any, Optional, TextIO

from slurmtools.common.control_dir import control_dir_for
from slurmtools.job.notebook import JobStatus, SpecLike, load, status
from slurmtools.job.submit import StatusLine
from slurmtools.report import text as jobreport

REPORT_FRAME_HEIGHT_PX = 2600
END_STATE_WAIT_S = 60.0      # after submitit says done, how long to wait for Slurm's end state


def in_jupyter() -> bool:
    """True inside a Jupyter kernel (not a plain IPython terminal, not a script)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def watch(job: Any, spec: Optional[SpecLike] = None, *, poll_s: float = 1.0, out: Optional[TextIO] = None) -> JobStatus:
    """Until the job ends, its state and newest progress on one line, updated in place; the last status."""
    display_handle: Any = None
    line = None
    if in_jupyter():
        from IPython.display import Pretty, display
        display_handle = display(Pretty("submitted"), display_id=True)
    else:
        line = StatusLine(out or sys.stdout)
    shown = ""
    done_since: Optional[float] = None
    while True:
        if done_since is None and job.done():
            done_since = time.monotonic()
        current = status(job, spec, tail_lines=0)
        # submitit's done() can come while Slurm still says COMPLETING: the last line is the end state
        finished = done_since is not None and (current.finished or time.monotonic() - done_since > END_STATE_WAIT_S)
        text = str(current).splitlines()[0]
        if text != shown:
            shown = text
            if display_handle is not None:
                from IPython.display import Pretty
                display_handle.update(Pretty(text))
            elif line is not None:
                line.change(text, "")
        if finished:
            break
        time.sleep(poll_s)
    if line is not None:
        line.end()
    return current


def _report(job: Any, spec: SpecLike) -> jobreport.JobReport:
    checkpoint_dir = load(spec).checkpoint_dir
    if not checkpoint_dir:
        raise ValueError("the job's report needs a spec with a checkpoint_dir (its control dir is there)")
    control_dir: Path = control_dir_for(checkpoint_dir, "", str(job.job_id))
    report = jobreport.load(control_dir)
    if report is None:
        raise ValueError(f"job {job.job_id}: no ledger records at {control_dir} yet")
    return report


def report_page(job: Any, spec: SpecLike) -> str:
    """The job's HTML report (slurmtools report --html) as a string."""
    from slurmtools.report import html as report_html
    return report_html.render(_report(job, spec))


def show_report(job: Any, spec: SpecLike) -> None:
    """The report inline: the HTML page in a notebook, the text form elsewhere."""
    if not in_jupyter():
        print(jobreport.format_text(_report(job, spec)))
        return
    from IPython.display import HTML, display
    page = report_page(job, spec)
    display(HTML(f'<iframe srcdoc="{html.escape(page, quote=True)}" width="100%" '
                 f'height="{REPORT_FRAME_HEIGHT_PX}" style="border:0"></iframe>'))
