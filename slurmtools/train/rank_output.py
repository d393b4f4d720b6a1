"""Each line a rank prints reaches the job's output whole, never merged mid-line with another's.

torchrun starts every worker as `python -u` (unbuffered: run.py adds "-u"), and the workers of a
node share one pipe to srun. Unbuffered, print() writes its text and its newline as two write
calls, so another rank's line lands between them (seen in a job's .out: `rank 1 step 4 loss
26.3294rank 0 step 4 loss 29.7548`); PYTHONUNBUFFERED=1, set in many images, does the same under
the srun launcher's ranks, and block buffering splits lines at 8 KiB boundaries instead. Line
buffering makes each line one write, and a pipe writes up to PIPE_BUF (4 KiB) at once.
"""
from __future__ import annotations

import sys
from typing import Iterable, Optional, TextIO


def whole_lines(streams: Optional[Iterable[TextIO]] = None) -> None:
    """Line-buffer the process's stdout and stderr (or streams): one write per line. A stream that
    cannot be reconfigured (a notebook's, a test runner's capture) is left as it is."""
    for stream in (sys.stdout, sys.stderr) if streams is None else streams:
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is None:
            continue
        try:
            reconfigure(line_buffering=True, write_through=False)
        except (ValueError, OSError):     # detached or closed: nothing to do for it
            continue
